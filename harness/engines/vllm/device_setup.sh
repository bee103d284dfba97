# Source on the GPU host after the staged vLLM's vllm_env.sh (../shared/device/stage_vllm.sh):
#   source /tmp/vllm-site/vllm_env.sh && source harness/engines/vllm/device_setup.sh
# Makes this checkout importable and registers the plugin's vllm.general_plugins entry point.
# The host has no package index: an editable install with the image's setuptools, or, failing
# that, a bare dist-info (entry points only) on PYTHONPATH.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if ! python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/tmp/cb-install.log 2>&1; then
  meta=/tmp/cb-meta/commitbench-0.1.0.dist-info
  mkdir -p "$meta"
  printf 'Metadata-Version: 2.1\nName: commitbench\nVersion: 0.1.0\n' >"$meta/METADATA"
  printf '[vllm.general_plugins]\ncommitbench = harness.engines.vllm.plugin:register\n' >"$meta/entry_points.txt"
  export PYTHONPATH="/tmp/cb-meta:$PYTHONPATH"
  echo "device_setup: editable install failed ($(tail -1 /tmp/cb-install.log)); using a bare dist-info"
fi
python3 - <<'PY'
from importlib.metadata import entry_points
import torch, vllm
assert any(e.name == "commitbench" for e in entry_points(group="vllm.general_plugins")), "plugin not registered"
print(f"device_setup: vllm {vllm.__version__}, torch {torch.__version__}, "
      f"{torch.cuda.get_device_name(0)}, plugin registered")
PY
