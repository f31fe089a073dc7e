"""Quantized weights: methods and their checks (`config`), the int8/int4 weight formats (`weights`), and
readers of the quantized files (`gguf_file`, `packed_int4`). See docs/quantization.md."""

from inference.quantization.config import METHODS, QuantizationConfig, linear_weight, resolve_quantization

__all__ = ["METHODS", "QuantizationConfig", "linear_weight", "resolve_quantization"]
