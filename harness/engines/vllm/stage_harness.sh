#!/usr/bin/env bash
# Stage what the harness needs on the GPU host beyond ../shared/device/stage_vllm.sh's vLLM bundle
# (run here, in the repo root, with the project's venv active):
#   .whl/      hydra-core, omegaconf and antlr4 wheels (the host's image has the rest: aiohttp, uvloop,
#              numpy, scipy, pyarrow, matplotlib, rich, joblib, tokenizers)
#   .devdata/  ShareGPT's filtered requests as lengths (the 125 MB dataset cannot travel; see
#              `python -m harness workloads export`)
#   .devrun/   the commit this checkout is (commit: HEAD, -dirty with local changes) and HEAD's file list with
#              blob ids (files): the host has no .git, so harness/provenance.py records this commit in every
#              result, and -dirty where a file there differs from it. The device copies the working tree at each
#              call: after a commit, refresh only this part with `bash harness/engines/vllm/stage_harness.sh commit`.
# All three are git-ignored. On the host, after unpacking vLLM:
#   source /tmp/vllm-site/vllm_env.sh
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/cbsite .whl/*.whl
#   export PYTHONPATH=/tmp/cbsite:$PYTHONPATH && source harness/engines/vllm/device_setup.sh
#   python3 -m harness sweep sweep=h200_35b requests_from.sharegpt=.devdata/sharegpt.jsonl out=/tmp/h200 ...
#   tar czf $OUT/h200.tgz -C /tmp h200      # bring the result folder back as one file
# A device call carries only the ignored paths it names: name .devdata in every call that runs a sweep.
# A sweep longer than one call's limit resumes in the next with the same out= (under `timeout`, so the
# tar still runs); several GPUs: add engine.tensor_parallel_size=N (results/h200x2-tp2-35b/README.md).
# The kernel benchmark needs no vLLM (the image's torch, Triton and pytest do): carry .whl only, then
#   python3 -m pip install -q --no-index --no-deps --target /tmp/cbsite .whl/*.whl && export PYTHONPATH=/tmp/cbsite:$PWD
#   python3 -m pytest -q tests/test_kernels.py -k "not bench" && python3 -m harness bench kernels out=$OUT/kernels/h200.json
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
for d in .whl .devdata .devrun; do
  grep -qxF "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >>.git/info/exclude
done
mkdir -p .devrun
head=$(git rev-parse HEAD)
[ -n "$(git status --porcelain --untracked-files=no)" ] && head="$head-dirty"
echo "$head" > .devrun/commit
git ls-tree -r HEAD > .devrun/files
echo "stage_harness: .devrun/commit = $head"
[ "${1:-}" = commit ] && exit 0
mkdir -p .whl .devdata
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform any -d .whl hydra-core==1.3.2 omegaconf==2.3.0
python -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3   # sdist only on PyPI: build it
python -m harness workloads export workload=sharegpt out=.devdata/sharegpt.jsonl
ls -la .whl .devdata
