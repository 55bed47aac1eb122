"""StepStats: device-side sums and NaN-ignoring running extremes, read back once per optimizer step."""

from __future__ import annotations

import math

import torch
from launchgen.trainers.stats import StepStats, as_f64


def test_sums_mix_floats_and_tensors() -> None:
    st = StepStats()
    st.add("a", 1.5)
    st.add("a", torch.tensor(2.0))
    st.add_mean("m", torch.tensor(3.0), 2.0)
    st.add_mean("m", 1.0, torch.tensor(2.0))
    assert float(as_f64(st.sums["a"], torch.device("cpu"))) == 3.5
    assert float(st.sums["mean:m:sum"]) == 4.0 and float(st.sums["mean:m:n"]) == 4.0


def test_extremes_skip_nan_and_inf() -> None:
    st = StepStats()
    for v in (torch.tensor(math.nan), torch.tensor(0.5), torch.tensor(math.inf), 0.2, torch.tensor(0.9, dtype=torch.float64)):
        st.min("lo", v)
        st.max("hi", v)
    assert float(st.mins["lo"]) == 0.2
    assert float(st.maxs["hi"]) == 0.9
    st.min("only_missing", torch.tensor(-math.inf))
    st.min("only_missing", math.nan)
    assert math.isnan(float(st.mins["only_missing"]))


class _One:
    num_processes = 1
    device = torch.device("cpu")


def test_metrics_are_per_micro_batch_then_averaged_as_trl() -> None:
    """TRL logs one value per compute_loss call (micro-batch) and averages them; a step's sums are not pooled."""
    from launchgen.trainers.stats import STEP_TOKENS, reduce_step

    st = StepStats()
    st.add("kl_sum", 1.0)  # micro-batch 1: kl 1/4 over 4 tokens
    st.add("kl_count", 4.0)
    st.add_mean("policy_loss", 2.0, 1.0)
    st.min("clip_ratio/low_min", 0.5)
    st.add(STEP_TOKENS, 4.0)
    st.next_micro_batch()
    st.add("kl_sum", 3.0)  # micro-batch 2: kl 3/6, in two passes
    st.add("kl_count", 2.0)
    st.add("kl_sum", 0.0)
    st.add("kl_count", 4.0)
    st.add_mean("policy_loss", 4.0, 1.0)
    st.min("clip_ratio/low_min", 0.1)
    st.add(STEP_TOKENS, 6.0)
    out = reduce_step(st, _One(), lambda t: t, ())
    assert out["kl"] == (0.25 + 0.5) / 2  # pooled would be 4 / 10
    assert out["policy_loss"] == 3.0
    assert out["clip_ratio/low_min"] == (0.5 + 0.1) / 2  # the mean of each micro-batch's min, as TRL
    assert out[STEP_TOKENS] == 10.0


def test_a_metric_missing_from_a_micro_batch_is_averaged_over_the_others() -> None:
    from launchgen.trainers.stats import reduce_step

    st = StepStats()
    st.add("entropy_sum", 3.0)
    st.add("entropy_count", 1.0)
    st.next_micro_batch()
    st.add("entropy_sum", 0.0)
    st.add("entropy_count", 0.0)  # an all-padding micro-batch: TRL's 0 / clamp(0, 1) = 0 counts
    st.next_micro_batch()
    st.max("clip_ratio/high_max", 1.0)
    out = reduce_step(st, _One(), lambda t: t, ())
    assert out["entropy"] == 1.5
    assert out["clip_ratio/high_max"] == 1.0
