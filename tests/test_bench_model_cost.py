"""The model cost benchmark on the small generated set, each GEM timed once."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.bench_model_cost import main, smaller_gems, written_out_attention


def test_each_smaller_gem_cuts_what_its_name_says() -> None:
    configs = smaller_gems()
    base = configs["default"]
    assert configs["1 InterFormer layer"].interformer.num_layers == 1
    assert configs["1 pyramid level"].pyramid.num_levels == 1
    assert configs["1 Wukong layer"].wukong.num_layers == 1
    both = configs["1 layer, 1 level"]
    assert (both.interformer.num_layers, both.pyramid.num_levels) == (1, 1)
    assert base.interformer.num_layers > 1
    assert base.pyramid.num_levels > 1
    assert base.wukong.num_layers > 1


def test_the_benchmark_prices_every_gem_and_splits_the_forward(tmp_path: Path) -> None:
    out = tmp_path / "cost.json"
    args = ["--batch-size", "512", "--repeat", "1", "--optimizer", "adam+adagrad"]
    # Dynamo's own backend: the compiled section's path without inductor's
    # minutes of code generation.
    args += ["--compile", "eager"]
    assert main([*args, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["optimizer"] == "adam+adagrad"
    assert set(result["cost"]) == set(smaller_gems())
    for run in result["cost"].values():
        assert run["gem"] > 0
        assert run["dlrm"] > 0
        assert run["gem_time_vs_dlrm"] == run["dlrm"] / run["gem"]
    forward = result["forward_ms"]
    # A module's hooks enclose its children's.
    assert forward["trunk"] >= forward["trunk.interaction.0"] > 0
    assert forward["pyramid"] >= forward["pyramid.levels.0"] > 0
    assert set(result["gather"]) == {"(B, H, Dh)", "(B, n, D)"}
    assert set(result["table_optimizer"]) == {"gem", "dlrm", "dcnv2"}
    for run in result["table_optimizer"].values():
        assert run["speedup"] == run["adam+adagrad"] / run["adam"] > 0
    assert 0 < result["history_events_per_example"] <= 32
    assert len(result["attention"]) == 2  # the trunk's and the pyramid's shapes
    for ms in result["attention"].values():
        assert set(ms) == {"additive", "boolean", "written out"}
    compiled = result["compiled"]
    for name in ("gem", "dlrm"):
        run = compiled[name]
        assert run["speedup"] == run["compiled"] / run["eager"]
        assert run["first_step_s"] > 0
    fastest_dlrm = max(compiled["dlrm"]["eager"], compiled["dlrm"]["compiled"])
    gem_ratio = fastest_dlrm / compiled["gem"]["compiled"]
    assert compiled["gem_compiled_time_vs_dlrm"] == gem_ratio


def test_the_attention_peers_compute_the_fused_attention() -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(5, 2, 4, 16) for _ in range(3))
    visible = torch.rand(5, 1, 4, 4) < 0.5
    visible[..., 0] = True
    additive = torch.zeros(visible.shape).masked_fill(~visible, -3.0e38)
    fused = F.scaled_dot_product_attention(q, k, v, attn_mask=additive)
    torch.testing.assert_close(written_out_attention(q, k, v, visible), fused)
    boolean = F.scaled_dot_product_attention(q, k, v, attn_mask=visible)
    torch.testing.assert_close(boolean, fused)
