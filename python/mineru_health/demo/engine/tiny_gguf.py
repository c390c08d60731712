"""A tiny random-weight MinerU 2.5 VLM for llama.cpp: model GGUF + vision projector GGUF.

MinerU 4.0's default engine on CPU is in-process llama.cpp (``mineru_llama_cpp.Engine(model,
mmproj)``) loading MinerU2.5's GGUF export: a ``qwen2vl`` language model (M-RoPE) and a
``clip`` projector of type ``qwen2vl_merger`` (a Qwen2-VL ViT, 2x2 patch merge). The real
weights cannot be downloaded here, so this writes the same architecture at toy size with
llama.cpp's own writer (the ``gguf`` package): the engine loads it, encodes images, decodes
and samples exactly as it would the real model. Only the text it writes is nonsense.

One thing is designed rather than random: every token embeds near the all-ones vector and
the output head's only non-zero row is the end-of-turn token's, so greedy or sampled decoding
ends a reply after a token or two. MinerU sets no ``max_new_tokens``, so a purely random model
would decode until its context is full; with this one a parse completes. Pass
``ignore_eos=True`` (``SamplingParams``) to keep it decoding (the busy-engine benchmark does).

    python -m mineru_health.demo.engine.tiny_gguf OUT_DIR [--mineru-home]   # prints paths, timing

``--mineru-home`` lays the files out as MinerU's model store expects them under
``OUT_DIR/models`` (``MINERU_HOME=OUT_DIR``, ``MINERU_MODEL_SOURCE=local``), together with
the stand-in small ONNX models of ``tiny_onnx.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# MinerU 4.0.12's registry (mineru/model/registry.py): where it looks for the GGUF pair.
GGUF_REPO_DIR = "MinerU2.5-Pro-2605-1.2B-GGUF"
GGUF_MAIN = "MinerU2.5-Pro-2605-1.2B-Q8_0.gguf"
GGUF_MMPROJ = "mmproj-MinerU2.5-Pro-2605-1.2B-Q8_0.gguf"
COMPLETE_MARKER = ".mineru_complete"  # mineru/model/download.py

END_OF_TURN = "<|im_end|>"
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    END_OF_TURN,
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|box_start|>",
    "<|box_end|>",
)
# One merge: llama.cpp refuses a BPE vocabulary without a merges list.
MERGE = ("a", "b")

# A Qwen-style chat template of our own; llama-server replaces each image part with its media
# marker before rendering, so the template only ever sees text parts.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "<|im_start|>{{ message.role }}\n"
    "{%- if message.content is string -%}{{ message.content }}"
    "{%- else -%}{%- for part in message.content -%}"
    "{%- if part.type == 'text' -%}{{ part.text }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "<|im_end|>\n"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)


@dataclass(frozen=True)
class TinyVlm:
    """Sizes of the toy model; the defaults load in well under a second and write ~1 MB."""

    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    n_layer: int = 2
    # A context that an A4 page's block fits (~1.4k tokens) and an A1 page's does not (~3.2k):
    # a document with oversized pages meets a real ContextExceededError.
    context_length: int = 2048
    vision_embd: int = 32
    vision_head: int = 2
    vision_ff: int = 64
    vision_layer: int = 1
    patch_size: int = 14
    # Largest image the projector takes before resizing it down: high enough that an image's
    # token count follows its size, as with MinerU's real projector.
    image_max_pixels: int = 4096 * 4096
    seed: int = 26


def byte_tokens() -> list[str]:
    """GPT-2's byte-level alphabet: one printable code point per byte value."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    shifted = 0
    table: dict[int, str] = {}
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + shifted)
            shifted += 1
    return [table[b] for b in range(256)]


def _vocab() -> tuple[list[str], list[int]]:
    import gguf  # type: ignore[import-not-found,unused-ignore]

    tokens = byte_tokens() + ["".join(MERGE)]
    types = [gguf.TokenType.NORMAL] * len(tokens)
    tokens += list(SPECIAL_TOKENS)
    types += [gguf.TokenType.CONTROL] * len(SPECIAL_TOKENS)
    return tokens, [int(t) for t in types]


def _normal(rng: np.random.Generator, *shape: int, std: float = 0.02) -> np.ndarray:
    return (rng.standard_normal(shape) * std).astype(np.float32)


def write_model(path: Path, spec: TinyVlm = TinyVlm()) -> None:
    """The ``qwen2vl`` language model (tokenizer and chat template included)."""
    import gguf  # type: ignore[import-not-found,unused-ignore]

    rng = np.random.default_rng(spec.seed)
    tokens, token_types = _vocab()
    n_vocab = len(tokens)
    head_dim = spec.n_embd // spec.n_head
    kv_dim = head_dim * spec.n_head_kv
    eot = tokens.index(END_OF_TURN)

    writer = gguf.GGUFWriter(str(path), "qwen2vl")
    writer.add_name("mineru-health tiny MinerU2.5 stand-in")
    writer.add_context_length(spec.context_length)
    writer.add_embedding_length(spec.n_embd)
    writer.add_block_count(spec.n_layer)
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head_kv)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1_000_000.0)
    # M-RoPE: temporal, height, width (and an unused fourth) sections of head_dim / 2.
    quarter = head_dim // 2
    writer.add_rope_dimension_sections(
        [quarter - 2 * (quarter // 3), quarter // 3, quarter // 3, 0]
    )
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)

    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges([" ".join(MERGE)])
    writer.add_eos_token_id(eot)
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    # Every token near the all-ones direction; the head scores only the end-of-turn token.
    writer.add_tensor(
        "token_embd.weight",
        np.ones((n_vocab, spec.n_embd), np.float32) + _normal(rng, n_vocab, spec.n_embd),
    )
    head = np.zeros((n_vocab, spec.n_embd), np.float32)
    head[eot] = 1.0
    writer.add_tensor("output.weight", head)
    writer.add_tensor("output_norm.weight", np.ones(spec.n_embd, np.float32))
    for i in range(spec.n_layer):
        blk = f"blk.{i}"
        writer.add_tensor(f"{blk}.attn_norm.weight", np.ones(spec.n_embd, np.float32))
        writer.add_tensor(f"{blk}.attn_q.weight", _normal(rng, spec.n_embd, spec.n_embd))
        writer.add_tensor(f"{blk}.attn_q.bias", _normal(rng, spec.n_embd))
        writer.add_tensor(f"{blk}.attn_k.weight", _normal(rng, kv_dim, spec.n_embd))
        writer.add_tensor(f"{blk}.attn_k.bias", _normal(rng, kv_dim))
        writer.add_tensor(f"{blk}.attn_v.weight", _normal(rng, kv_dim, spec.n_embd))
        writer.add_tensor(f"{blk}.attn_v.bias", _normal(rng, kv_dim))
        writer.add_tensor(f"{blk}.attn_output.weight", _normal(rng, spec.n_embd, spec.n_embd))
        writer.add_tensor(f"{blk}.ffn_norm.weight", np.ones(spec.n_embd, np.float32))
        writer.add_tensor(f"{blk}.ffn_gate.weight", _normal(rng, spec.n_ff, spec.n_embd))
        writer.add_tensor(f"{blk}.ffn_up.weight", _normal(rng, spec.n_ff, spec.n_embd))
        writer.add_tensor(f"{blk}.ffn_down.weight", _normal(rng, spec.n_embd, spec.n_ff))
    _finish(writer)


def write_mmproj(path: Path, spec: TinyVlm = TinyVlm()) -> None:
    """The ``qwen2vl_merger`` vision projector: a Qwen2-VL ViT and its 2x2 patch merger."""
    import gguf  # type: ignore[import-not-found,unused-ignore]

    rng = np.random.default_rng(spec.seed + 1)
    d, ff, p = spec.vision_embd, spec.vision_ff, spec.patch_size
    merged = d * 4  # spatial merge 2x2

    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.has_text_encoder", False)
    writer.add_string("clip.projector_type", "qwen2vl_merger")
    writer.add_bool("clip.use_gelu", False)
    writer.add_bool("clip.use_silu", False)
    writer.add_uint32("clip.vision.image_size", p * 40)
    writer.add_uint32("clip.vision.patch_size", p)
    writer.add_uint32("clip.vision.embedding_length", d)
    writer.add_uint32("clip.vision.feed_forward_length", ff)
    writer.add_uint32("clip.vision.block_count", spec.vision_layer)
    writer.add_uint32("clip.vision.attention.head_count", spec.vision_head)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_uint32("clip.vision.projection_dim", spec.n_embd)
    writer.add_uint32("clip.vision.spatial_merge_size", 2)
    writer.add_uint32("clip.vision.image_max_pixels", spec.image_max_pixels)
    writer.add_array("clip.vision.image_mean", [0.48145466, 0.4578275, 0.40821073])
    writer.add_array("clip.vision.image_std", [0.26862954, 0.26130258, 0.27577711])
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)

    # Qwen2-VL's temporal patch conv is stored as two 2-D convs (frames 0 and 1).
    writer.add_tensor("v.patch_embd.weight", _normal(rng, d, 3, p, p).astype(np.float16))
    writer.add_tensor("v.patch_embd.weight.1", _normal(rng, d, 3, p, p).astype(np.float16))
    for i in range(spec.vision_layer):
        blk = f"v.blk.{i}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            writer.add_tensor(f"{blk}.{name}.weight", _normal(rng, d, d))
            writer.add_tensor(f"{blk}.{name}.bias", _normal(rng, d))
        for name in ("ln1", "ln2"):
            writer.add_tensor(f"{blk}.{name}.weight", np.ones(d, np.float32))
            writer.add_tensor(f"{blk}.{name}.bias", np.zeros(d, np.float32))
        writer.add_tensor(f"{blk}.ffn_up.weight", _normal(rng, ff, d))
        writer.add_tensor(f"{blk}.ffn_up.bias", _normal(rng, ff))
        writer.add_tensor(f"{blk}.ffn_down.weight", _normal(rng, d, ff))
        writer.add_tensor(f"{blk}.ffn_down.bias", _normal(rng, d))
    writer.add_tensor("v.post_ln.weight", np.ones(d, np.float32))
    writer.add_tensor("v.post_ln.bias", np.zeros(d, np.float32))
    writer.add_tensor("mm.0.weight", _normal(rng, merged, merged))
    writer.add_tensor("mm.0.bias", _normal(rng, merged))
    writer.add_tensor("mm.2.weight", _normal(rng, spec.n_embd, merged))
    writer.add_tensor("mm.2.bias", _normal(rng, spec.n_embd))
    _finish(writer)


def _finish(writer: object) -> None:
    writer.write_header_to_file()  # type: ignore[attr-defined]
    writer.write_kv_data_to_file()  # type: ignore[attr-defined]
    writer.write_tensors_to_file()  # type: ignore[attr-defined]
    writer.close()  # type: ignore[attr-defined]


def write_pair(out_dir: Path, spec: TinyVlm = TinyVlm()) -> tuple[Path, Path]:
    """Writes model and projector into ``out_dir`` (MinerU's file names); returns both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model, mmproj = out_dir / GGUF_MAIN, out_dir / GGUF_MMPROJ
    # Written under temporary names, then renamed: a reader never sees half a file.
    for target, write in ((model, write_model), (mmproj, write_mmproj)):
        partial = target.with_suffix(".partial")
        write(partial, spec)
        partial.replace(target)
    return model, mmproj


def write_mineru_home(home: Path, spec: TinyVlm = TinyVlm()) -> dict[str, str]:
    """MinerU 4.0's model store under ``home/models``: the GGUF pair and the layout stand-in."""
    from . import tiny_onnx

    models = home / "models"
    model, mmproj = write_pair(models / GGUF_REPO_DIR, spec)
    # MinerU takes a whole-repository download as complete only with this marker in it.
    (models / GGUF_REPO_DIR / COMPLETE_MARKER).touch()
    small = tiny_onnx.write_small_models(models)
    return {"model": str(model), "mmproj": str(mmproj), **{p.stem: str(p) for p in small}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument(
        "--mineru-home",
        action="store_true",
        help="lay the files out as MinerU's model store (OUT_DIR is MINERU_HOME)",
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    if args.mineru_home:
        paths = write_mineru_home(args.out_dir)
    else:
        model, mmproj = write_pair(args.out_dir)
        paths = {"model": str(model), "mmproj": str(mmproj)}
    elapsed = time.perf_counter() - started
    sizes = {name: Path(p).stat().st_size for name, p in paths.items()}
    print(json.dumps({"paths": paths, "bytes": sizes, "seconds": round(elapsed, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
