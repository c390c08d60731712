"""A tiny random-weight MinerU 2.5 VLM in Hugging Face layout, for a real vLLM to load.

MinerU 2.5's VLM is a ``Qwen2VLForConditionalGeneration`` (a Qwen2 language model with
M-RoPE and a Qwen2-VL ViT whose 2x2 patch merger feeds it). MinerU's in-process vLLM
backends (3.x ``vlm-vllm-async-engine``, 4.0's vLLM engine) hand its directory to
``AsyncLLM``; ``mineru_vl_utils`` then renders each prompt with the tokenizer's chat
template and sends the page image with it. The real weights cannot be downloaded here,
so this writes the same architecture at toy size with ``transformers`` (config, safetensors
weights, tokenizer with its chat template, image processor): vLLM loads, encodes images,
prefills and samples exactly as it would the real model. Only the text is nonsense.

One thing is designed (:func:`_design`): whatever the image, every reply is the same
eight tokens, one text block over the top fifth of the image in MinerU 2.5's layout syntax,
then the end of turn. MinerU's client fails a reply cut by ``max_tokens`` (a random head
would never stop), and with a block the parse has a second step: MinerU crops the block
from the page and sends it at its own size, so a large page's block is thousands of image
tokens (a real "longer than the maximum model length" error on a short context) while an
A4 page's fits.

Sizes: hidden 128 with 2 heads (vLLM's CPU attention refuses a head size of 16), two
layers, a one-block ViT; ~1 MB on disk. Run it with the Python of a venv that has
``transformers`` and ``torch`` (MinerU's with vLLM: the demo's ``--engine vllm``; the vLLM
venvs of ``scripts/vllm_venvs.sh``)::

    # prints paths, sizes, seconds (JSON)
    python -m mineru_health.demo.engine.tiny_qwen2vl OUT_DIR [CONTEXT]

``CONTEXT`` (default 4096) is the model's own context (``max_position_embeddings``), which
vLLM takes as ``max_model_len`` when it is given none (MinerU 4.0.12 gives none).

``OUT_DIR/mineru.json`` is a MinerU tools config pointing its ``vlm`` models there
(``MINERU_TOOLS_CONFIG_JSON=OUT_DIR/mineru.json``, ``MINERU_MODEL_SOURCE=local``).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from mineru_health.demo.engine.tiny_gguf import byte_tokens

END_OF_TURN = "<|im_end|>"
PAD = "<|endoftext|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
SPECIAL_TOKENS = (
    PAD,
    "<|im_start|>",
    END_OF_TURN,
    VISION_START,
    VISION_END,
    IMAGE_PAD,
    VIDEO_PAD,
    "<|box_start|>",
    "<|box_end|>",
    "<|ref_start|>",
    "<|ref_end|>",
    "<|rotate_up|>",
)
# What every reply says, one token after the other: one text block over the top fifth of the
# image, in MinerU 2.5's layout syntax (box in thousandths of the image, type, rotation).
# Its two words are whole tokens of their own, so every token of the reply is distinct.
BOX = "000 000 999 200"
REPLY = (
    "<|box_start|>",
    BOX,
    "<|box_end|>",
    "<|ref_start|>",
    "text",
    "<|ref_end|>",
    "<|rotate_up|>",
)
NEWLINE = "\u010a"  # the byte-level token of "\n", the last of every prompt (chat template)

HIDDEN = 128
HEADS = 2
LAYERS = 2
FFN = 256
VISION_EMBED = 64
VISION_HEADS = 2
CONTEXT = 4096
# Images up to 4 Mpx keep their size (28 px per image token): MinerU's layout image (a 1036 px
# square) is 1369 tokens, an A4 page's text blocks a few hundred, a large page's whole-page
# block thousands, over a short context (a real request error).
MAX_PIXELS = 2048 * 2048
MIN_PIXELS = 56 * 56
SEED = 25

# A Qwen-style chat template of our own: MinerU's client sends each image as a content
# part of type "image"; vLLM's Qwen2-VL processing expands the image pad it renders to.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}"
    + VISION_START
    + IMAGE_PAD
    + VISION_END
    + "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_tokenizer(out: Path, context: int) -> Any:
    """A byte-level BPE tokenizer (no merges: one token per byte) with Qwen's specials."""
    from tokenizers import (  # type: ignore[import-not-found,unused-ignore]
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
    )
    from transformers import PreTrainedTokenizerFast  # type: ignore[import-not-found,unused-ignore]

    vocab = {token: i for i, token in enumerate(byte_tokens())}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token=END_OF_TURN, pad_token=PAD, model_max_length=context
    )
    tokenizer.add_special_tokens(
        {"additional_special_tokens": [t for t in SPECIAL_TOKENS if t not in (PAD, END_OF_TURN)]}
    )
    tokenizer.add_tokens([BOX, "text"])
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(str(out))
    return tokenizer


def write_processor(out: Path, tokenizer: Any) -> None:
    """Qwen2-VL's processor: image and video processors (14 px patches, 2 frames per temporal
    patch, 2x2 merge), the tokenizer and the chat template. vLLM's Qwen2-VL profiling renders
    a dummy video too, so the video processor must be there even though MinerU sends none."""
    from transformers import (  # type: ignore[import-not-found,unused-ignore]
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    pixels = {
        "min_pixels": MIN_PIXELS,
        "max_pixels": MAX_PIXELS,
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2,
    }
    processor = Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessor(**pixels),
        video_processor=Qwen2VLVideoProcessor(**pixels),
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(str(out))


def write_model(out: Path, tokenizer: Any, context: int) -> None:
    import torch  # type: ignore[import-not-found,unused-ignore]
    from transformers import (  # type: ignore[import-not-found,unused-ignore]
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
    )

    def token_id(token: str) -> int:
        return int(tokenizer.convert_tokens_to_ids(token))

    vocab_size = len(tokenizer)
    eot = token_id(END_OF_TURN)
    text = {
        "vocab_size": vocab_size,
        "hidden_size": HIDDEN,
        "intermediate_size": FFN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "max_position_embeddings": context,
        "rms_norm_eps": 1e-6,
        # M-RoPE: temporal, height and width sections of head_dim / 2 (64 / 2 here).
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1_000_000.0,
            "mrope_section": [16, 8, 8],
        },
        "tie_word_embeddings": False,
        "bos_token_id": token_id(PAD),
        "eos_token_id": eot,
        "pad_token_id": token_id(PAD),
        "dtype": "float32",
    }
    vision = {
        "depth": 1,
        "embed_dim": VISION_EMBED,
        "hidden_size": HIDDEN,
        "mlp_ratio": 2,
        "num_heads": VISION_HEADS,
        "in_channels": 3,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    }
    config = Qwen2VLConfig(
        vision_config=vision,
        text_config=dict(text),
        image_token_id=token_id(IMAGE_PAD),
        video_token_id=token_id(VIDEO_PAD),
        vision_start_token_id=token_id(VISION_START),
        vision_end_token_id=token_id(VISION_END),
        **text,
    )
    config.architectures = ["Qwen2VLForConditionalGeneration"]
    torch.manual_seed(SEED)
    model = Qwen2VLForConditionalGeneration(config).to(torch.float32)
    with torch.no_grad():
        _design(model, [token_id(NEWLINE), *map(token_id, REPLY)], eot)
    model.save_pretrained(str(out), safe_serialization=True)
    generation = {"eos_token_id": eot, "pad_token_id": token_id(PAD), "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2))


def _design(model: Any, chain: list[int], eot: int, scale: float = 10.0) -> None:
    """The language model as a table of successors: after ``chain[i]`` comes ``chain[i + 1]``,
    after the last the end of turn, after any other token the end of turn.

    The layers' output projections are zero, so the last hidden state is the last token's
    embedding (normalised). Chain token ``i`` embeds as ``scale`` on coordinate ``i`` alone and
    the head row of its successor reads that coordinate (logit ~``scale * sqrt(hidden)``);
    every other token embeds near the all-ones vector, which only the end-of-turn row (all
    ones) scores high. Everything else (the ViT, attention, M-RoPE) stays random and runs.
    """
    import torch  # type: ignore[import-not-found,unused-ignore]

    for name, weight in model.named_parameters():
        if "visual" not in name and name.endswith(("o_proj.weight", "down_proj.weight")):
            weight.zero_()
    embed = model.get_input_embeddings().weight
    embed.copy_(torch.ones_like(embed) + 0.02 * torch.randn_like(embed))
    head = model.get_output_embeddings().weight
    head.zero_()
    head[eot] = 1.0
    for i, token in enumerate(chain):
        embed[token] = 0.0
        embed[token, i] = scale
        successor = chain[i + 1] if i + 1 < len(chain) else eot
        head[successor, i] += scale


def write(out: Path, context: int = CONTEXT) -> dict[str, Any]:
    """Writes the model into ``out`` (and ``out/mineru.json``); returns paths, sizes, seconds."""
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = write_tokenizer(out, context)
    write_processor(out, tokenizer)
    write_model(out, tokenizer, context)
    config = {"models-dir": {"vlm": str(out), "pipeline": str(out)}, "config_version": "1.3.1"}
    (out / "mineru.json").write_text(json.dumps(config, indent=2))
    elapsed = time.perf_counter() - started
    sizes = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()}
    return {
        "dir": str(out),
        "bytes": sizes,
        "total_bytes": sum(sizes.values()),
        "seconds": round(elapsed, 3),
    }


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2) or not all(a.isdigit() for a in argv[1:]):
        print(__doc__.splitlines()[0], file=sys.stderr)
        print("usage: tiny_qwen2vl.py OUT_DIR [CONTEXT]", file=sys.stderr)
        return 2
    print(json.dumps(write(Path(argv[0]), *map(int, argv[1:]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
