# source after unpacking: vLLM env, harness wheels, plugin registration, provenance
source /tmp/vllm-site/vllm_env.sh
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/cbsite .whl/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/cbsite:$PYTHONPATH
source harness/engines/vllm/device_setup.sh
# the commit stage_harness.sh recorded in .devrun/, checked against the files here (-dirty where they differ)
export COMMITBENCH_GIT_COMMIT=$(python3 -c "from harness.provenance import git_commit; print(git_commit())")
mkdir -p $OUT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $OUT/gpu.txt
python3 -c "import torch, triton, vllm; print('torch', torch.__version__, 'triton', triton.__version__, 'vllm', vllm.__version__)" > $OUT/versions.txt
echo "git $COMMITBENCH_GIT_COMMIT" >> $OUT/versions.txt
