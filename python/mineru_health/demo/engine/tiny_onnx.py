"""Stand-ins for MinerU 4.0's small ONNX models (layout, OCR), written with the ``onnx`` package.

MinerU 4.0's standard tier loads its ONNX layout model and OCR detector/recogniser when its
hybrid model context starts, and runs the layout model on every page before the VLM, so a
worker whose VLM is the tiny llama.cpp model of ``tiny_gguf.py`` still needs them. The real
ones (hundreds of MB) cannot be downloaded here. These graphs have no weights, only arithmetic
on their inputs' shapes, and the interfaces MinerU's wrappers check:

- layout (``mineru/model/layout/pp_doclayout_v2_onnx.py``): inputs ``image`` ``[B, 3, H, W]``
  and ``scale_factor`` ``[B, 2]``; outputs ``[N, 8]`` boxes (class, score, x1, y1, x2, y2, two
  reading-order keys) in page coordinates and ``[B]`` box counts. It finds one block per
  page, of class ``LABEL``, in the page's upper part, so every page sends one crop to the VLM.
- OCR detector (``mineru/model/ocr/pp_ocr_v6_onnx.py``): a DB probability map of zeros (finds
  no text line); recogniser: CTC scores of all-blank (reads nothing).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

# Where MinerU 4.0.12's registry (MINERU_4_MODELS_ONNX) looks for the layout model.
LAYOUT_DIR = Path("MinerU-4_models_onnx") / "Layout" / "PP-DocLayoutV2"
OCR_DIR = Path("MinerU-4_models_onnx") / "OCR" / "paddleocr"
INPUT_SIZE = 800
# PP-DocLayoutV2's class 1, "algorithm": a block MinerU's standard tier sends to the VLM, that
# needs no other small model (no table classifier, no formula recogniser, no OCR detector).
LABEL = 1
# The block, as fractions of the page: left, top, right, bottom.
BOX = (0.1, 0.1, 0.9, 0.45)

_CONFIG = f"""\
# Written by mineru_health.demo.engine: the stand-in layout model's preprocessing.
Preprocess:
- type: Resize
  target_size: [{INPUT_SIZE}, {INPUT_SIZE}]
  interp: 2
"""


def layout_graph() -> object:
    """The ONNX model (``onnx.ModelProto``)."""
    from onnx import (  # type: ignore[import-not-found,unused-ignore]
        TensorProto,
        helper,
        numpy_helper,
    )

    def const(name: str, value: np.ndarray) -> object:
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name))

    nodes = [
        # Page size from the scale factor MinerU feeds: (INPUT_SIZE / h, INPUT_SIZE / w).
        const("input_size", np.array([INPUT_SIZE, INPUT_SIZE], np.float32)),
        helper.make_node("Div", ["input_size", "scale_factor"], ["page_hw"]),
        # [w, h, w, h] per page, times the box fractions.
        const("swap", np.array([1, 0, 1, 0], np.int64)),
        helper.make_node("Gather", ["page_hw", "swap"], ["page_whwh"], axis=1),
        const("fractions", np.array(BOX, np.float32)),
        helper.make_node("Mul", ["page_whwh", "fractions"], ["corners"]),
        # Class, score in front; reading-order keys (0, 0) behind.
        helper.make_node("Shape", ["scale_factor"], ["sf_shape"]),
        const("first", np.array([0], np.int64)),
        helper.make_node("Gather", ["sf_shape", "first"], ["batch"]),
        const("two", np.array([2], np.int64)),
        helper.make_node("Concat", ["batch", "two"], ["pair_shape"], axis=0),
        const("head_row", np.array([LABEL, 0.99], np.float32)),
        helper.make_node("Expand", ["head_row", "pair_shape"], ["head"]),
        const("tail_row", np.array([0.0, 0.0], np.float32)),
        helper.make_node("Expand", ["tail_row", "pair_shape"], ["tail"]),
        helper.make_node("Concat", ["head", "corners", "tail"], ["boxes"], axis=1),
        # One box per page.
        const("one", np.array(1, np.int64)),
        helper.make_node("Expand", ["one", "batch"], ["counts"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mineru_health_tiny_layout",
        [
            helper.make_tensor_value_info(
                "image", TensorProto.FLOAT, ["B", 3, INPUT_SIZE, INPUT_SIZE]
            ),
            helper.make_tensor_value_info("scale_factor", TensorProto.FLOAT, ["B", 2]),
        ],
        [
            helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["N", 8]),
            helper.make_tensor_value_info("counts", TensorProto.INT64, ["B"]),
        ],
    )
    # Opset 17: understood by every onnxruntime MinerU 4.0 installs.
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def ocr_detector_graph() -> object:
    """``x`` ``[B, 3, H, W]`` -> a ``[B, 1, H, W]`` probability map of zeros."""
    from onnx import (  # type: ignore[import-not-found,unused-ignore]
        TensorProto,
        helper,
        numpy_helper,
    )

    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mean"], axes=[1], keepdims=1),
        helper.make_node(
            "Constant",
            [],
            ["zero"],
            value=numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        ),
        helper.make_node("Mul", ["mean", "zero"], ["maps"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mineru_health_tiny_ocr_det",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 3, "H", "W"])],
        [helper.make_tensor_value_info("maps", TensorProto.FLOAT, ["B", 1, "H", "W"])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def ocr_recognizer_graph(classes: int) -> object:
    """``x`` ``[B, 3, 48, W]`` -> ``[B, W / 8, classes]`` CTC scores, all on the blank class."""
    from onnx import (  # type: ignore[import-not-found,unused-ignore]
        TensorProto,
        helper,
        numpy_helper,
    )

    def const(name: str, value: np.ndarray) -> object:
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name))

    blank = np.zeros(classes, np.float32)
    blank[0] = 1.0
    nodes = [
        helper.make_node("Shape", ["x"], ["x_shape"]),
        const("batch_index", np.array([0], np.int64)),
        helper.make_node("Gather", ["x_shape", "batch_index"], ["batch"]),
        const("width_index", np.array([3], np.int64)),
        helper.make_node("Gather", ["x_shape", "width_index"], ["width"]),
        const("eight", np.array([8], np.int64)),
        helper.make_node("Div", ["width", "eight"], ["steps"]),
        const("classes", np.array([classes], np.int64)),
        helper.make_node("Concat", ["batch", "steps", "classes"], ["out_shape"], axis=0),
        const("blank_row", blank),
        helper.make_node("Expand", ["blank_row", "out_shape"], ["scores"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mineru_health_tiny_ocr_rec",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 3, 48, "W"])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["B", "T", classes])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _save(model: object, target: Path) -> None:
    import onnx  # type: ignore[import-not-found,unused-ignore]

    onnx.checker.check_model(model)  # type: ignore[arg-type,unused-ignore]
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    onnx.save(model, str(partial))  # type: ignore[arg-type,unused-ignore]
    partial.replace(target)


def _recognizer_classes() -> int:
    """MinerU's dictionary + blank + space (what its recogniser checks the output against)."""
    from mineru.model.ocr.resources import (  # type: ignore[import-untyped,import-not-found,unused-ignore]
        PPOCRV6_DICT_PATH,
    )

    lines = PPOCRV6_DICT_PATH.read_text(encoding="utf-8").splitlines()
    return len(lines) + 2


def write_small_models(models_dir: Path) -> list[Path]:
    """The layout and OCR stand-ins under ``models_dir`` (MinerU's ONNX repo layout)."""
    ocr = models_dir / OCR_DIR
    _save(ocr_detector_graph(), ocr / "ch_PP-OCRv6_tiny_det_infer.onnx")
    _save(ocr_recognizer_graph(_recognizer_classes()), ocr / "ch_PP-OCRv6_small_rec_infer.onnx")
    return [
        write_layout(models_dir),
        ocr / "ch_PP-OCRv6_tiny_det_infer.onnx",
        ocr / "ch_PP-OCRv6_small_rec_infer.onnx",
    ]


def write_layout(models_dir: Path) -> Path:
    """Writes ``inference.onnx`` and ``inference.yml`` under ``models_dir``; returns the model."""
    target = models_dir / LAYOUT_DIR
    target.mkdir(parents=True, exist_ok=True)
    (target / "inference.yml").write_text(_CONFIG, encoding="utf-8")
    _save(layout_graph(), target / "inference.onnx")
    return target / "inference.onnx"
