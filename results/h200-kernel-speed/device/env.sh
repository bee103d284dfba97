# source after unpacking: vLLM env, harness wheels, plugin registration, provenance
source /tmp/vllm-site/vllm_env.sh
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/cbsite .whl/*.whl 2>&1 | tail -1
export PYTHONPATH=/tmp/cbsite:$PYTHONPATH
source harness/engines/vllm/device_setup.sh
export COMMITBENCH_GIT_COMMIT=$(cat .devrun/commit)
mkdir -p $OUT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $OUT/gpu.txt
python3 -c "import torch, triton, vllm; print('torch', torch.__version__, 'triton', triton.__version__, 'vllm', vllm.__version__)" > $OUT/versions.txt
echo "git $COMMITBENCH_GIT_COMMIT" >> $OUT/versions.txt
