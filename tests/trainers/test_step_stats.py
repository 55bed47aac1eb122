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
