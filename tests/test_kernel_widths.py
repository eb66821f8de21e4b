"""The kernel library's model widths (codegen/triton/widths.py) are the published config's, and the dense linears
they give are the ones the FP8 GEMM variants are built for."""
import pytest

from dsv41c.codegen.triton import widths
from dsv41c.frontend.config import preset


def test_published_widths_are_the_full_preset():
    assert widths.ModelWidths.of(preset("full")) == widths.PUBLISHED


def test_widths_of_another_config_change_the_linears():
    mini = widths.ModelWidths.of(preset("mini"))
    assert mini != widths.PUBLISHED
    n, k = widths.dense_linears(mini)["wq_a"]
    assert (n, k) == (mini.q_lora_rank, mini.hidden_size)
    assert widths.dense_linears()["wo_b"] == (5120, 8192) and widths.dense_linears()["engram_wkv"] == (25600, 6144)


def test_a_config_without_a_width_is_named():
    with pytest.raises(ValueError, match="has no hidden_size"):
        widths.ModelWidths.of(object())
