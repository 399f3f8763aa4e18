# The project's commands. POSIX make; works on a fresh machine with python3.11, node/npm and make.
#   make test    the whole test suite (installs what it needs, starts Azurite and the simulator itself)
#   make demo    the storyline on the simulator        make bench   benchmarks -> bench-results.json
#   make soak    seeded fault-injection soak (SOAK_RUNS, default 1000)
#   make test-soak   the soak's lane of the tests (tests/soak: pinned seeds, a short soak, the invariants)
#   make up      a local stack (simulator, Azurite kept under .state/up, a host) to try fleetctl on, until Ctrl-C
#   make test-browser   the browser lane: installs Debian's Chromium if missing, runs the demo, opens its timeline
#   make aks-definitions   derive shared/kernel/definitions/*.json again from the Azure SDKs' models
#   make lint    ruff, the import contracts (lint-imports, .importlinter) and mypy on shared/ and realkube/ (mypy.ini)
#   make test-realkube   the real-control-plane lane: builds kube-apiserver, etcd, the controller manager,
#                the scheduler and kwok from Go modules (cached outside the repo), starts them on loopback,
#                runs the differential suite (simulator vs kube-apiserver) and the app's drains on it

.POSIX:
.PHONY: all venv azurite test test-soak demo bench soak lint clean realkube-build test-realkube aks-definitions up chromium test-browser

PYTHON = python3.11
VENV = .venv
PY = $(VENV)/bin/python
STAMP = $(VENV)/.requirements.stamp
AZURITE = .tools/azurite/node_modules/.bin/azurite
SOAK_RUNS ?= 1000
PREVIEW_SDK = .tools/sdk/containerservice-preview

all: test

# The venv is (re)built only when a requirements file changed since the last install.
venv: $(STAMP)

# The preview api-version's SDK goes apart (requirements-sdk-preview.txt): only its models are read, to derive
# the definitions in shared/kernel/definitions.
$(STAMP): requirements.txt requirements-dev.txt constraints.txt requirements-sdk-preview.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	rm -rf $(PREVIEW_SDK)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --target $(PREVIEW_SDK) -r requirements-sdk-preview.txt
	touch $(STAMP)

# The AgentPool definitions of the api-versions the app speaks, derived again from the SDKs' models
# (after a change of requirements.txt or requirements-sdk-preview.txt; tests/unit/test_aks_definitions.py says when).
aks-definitions: $(STAMP)
	$(PY) -m shared.kernel.definitions.derive
	PYTHONPATH=$(PREVIEW_SDK) $(PY) -m shared.kernel.definitions.derive

# Azurite (the storage emulator) from npm, pinned in devhost/azurite.py, into .tools/azurite.
azurite: $(AZURITE)

$(AZURITE): $(STAMP) devhost/azurite.py
	$(PY) -c "from devhost import azurite; azurite.ensure_installed()"
	test -x $(AZURITE)
	touch $(AZURITE)

test: $(STAMP) $(AZURITE)
	$(PY) -m pytest -q

# The real control plane, built from Go modules into ~/.cache/gpu-fleet-steward/realkube (realkube/build.py).
realkube-build: $(STAMP)
	$(PY) -m realkube build

# The soak lane: its pinned regression seeds, a short generated soak and the invariants' own tests (tests/soak).
test-soak: $(STAMP) $(AZURITE)
	$(PY) -m pytest -q -p no:cacheprovider tests/soak

test-realkube: realkube-build $(AZURITE)
	$(PY) -m pytest -q -p no:cacheprovider tests/realkube

# Debian's Chromium for the browser lane (headless; installed with apt-get when missing, as root on CI).
chromium:
	command -v chromium >/dev/null 2>&1 || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium)

# The browser lane: the demo's timeline page opened in headless Chromium (tests/browser).
test-browser: $(STAMP) $(AZURITE) chromium
	$(PY) -m pytest -q -p no:cacheprovider tests/browser

demo: $(STAMP) $(AZURITE)
	$(PY) -m demo

# A stack to try fleetctl on: simulator, Azurite (kept under .state/up) and a local host, until Ctrl-C.
up: $(STAMP) $(AZURITE)
	$(PY) -m devstack up

bench: $(STAMP) $(AZURITE)
	$(PY) -m bench

soak: $(STAMP) $(AZURITE)
	SOAK_RUNS=$(SOAK_RUNS) $(PY) -m soak

lint: $(STAMP)
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m mypy shared realkube

clean:
	rm -rf $(VENV) .tools .state .pytest_cache .mypy_cache bench-results.json
