# Quick start:  make up      (the whole stack on loopback: etcd, config service,
#                             workers, gateway, Envoy on :8080, with the demo model)
#               make test    (the whole suite, its files in parallel processes)
#               make test-fast (the in-process tier: the tests that start no process, in about a minute)
# One worker alone: make serve
# Both create .venv and install what they need on first use.
# The images: make images (then `sie up --images`, docs/deployment.md; no .venv needed to build them).
VENV ?= .venv
PYTHON := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
# The slowest tests are listed after every run: the whole suite has a 12-minute budget on 2 cores, the in-process
# tier 3 minutes.
PYTEST_ARGS ?= --durations=30
# make test runs the suite's files on this many pytest-xdist processes (--dist loadfile: each file whole, and the
# files sharing an HTTP edge together, tests/parallel_files.py, so module and session fixtures start once per
# process); most of a file's time is waiting on the processes it starts, so more processes than cores pays.
# TEST_PROCESSES=0 runs everything in this process.
TEST_PROCESSES ?= 3
# torch's threads wait for work passively in the tests' processes, pytest's own included (tests/conftest.py says why;
# it sets the same for the processes it starts, for a plain pytest run). Not for make bench or make up.
TEST_ENV := OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE}

.PHONY: up serve test test-fast test-durations lint dists constraints protos proto-check proto-lint proto-breaking bench manifests manifests-check

# Every distribution's pyproject.toml: a dependency added to any of them reinstalls.
PYPROJECTS := pyproject.toml contract/python/pyproject.toml lib/pyproject.toml clients/python/pyproject.toml \
  services/worker/pyproject.toml services/gateway/pyproject.toml services/config/pyproject.toml deploy/local/pyproject.toml \
  constraints.txt

$(INSTALLED): $(PYPROJECTS) scripts/bootstrap
	scripts/bootstrap $(VENV)
	touch $@

up: $(INSTALLED)
	$(VENV)/bin/sie up $(ARGS)

# The demo model is preloaded so the first request answers at once.
serve: $(INSTALLED)
	$(VENV)/bin/sie-worker serve --preload-models sentence-transformers/all-MiniLM-L6-v2 $(ARGS)

# Every test (CI runs this); the markers only order the files: slow ones, then clusters, then other processes.
test: $(INSTALLED)
	$(TEST_ENV) $(PYTHON) -m pytest -n $(TEST_PROCESSES) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# Record the last make test's seconds per file (pytest's cache) in tests/file_seconds.json: a clean clone (CI) has no
# cache and hands out the longest files first by these. Run after a make test on 2 cores when files came or went.
test-durations: $(INSTALLED)
	$(PYTHON) tests/parallel_files.py

# The in-process tier: every test that starts no process (a worker, etcd, Envoy or any other), but the slow ones.
test-fast: $(INSTALLED)
	$(TEST_ENV) $(PYTHON) -m pytest -m "not process and not slow" $(PYTEST_ARGS)

# Lint, format check and types of the shipped code (the generated stubs excluded; pyproject.toml's [tool.ruff]
# and [tool.mypy] hold the rules and the paths).
LINT_PATHS := lib services clients deploy tools contract/python/sie_contract
lint: $(INSTALLED)
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(VENV)/bin/mypy

# Pin what the environment has now (after a deliberate upgrade and a green suite) as the versions CI installs.
constraints: $(INSTALLED)
	{ grep '^#' constraints.txt; $(PYTHON) -m pip freeze --exclude-editable | grep -viE '^(torch|flagembedding)[=@ ]'; } \
	  > constraints.txt.new && mv constraints.txt.new constraints.txt

# Each distribution installs alone in a fresh virtual environment (scripts/check_distributions; CI runs it).
dists: $(INSTALLED)
	$(PYTHON) scripts/check_distributions $(ARGS)

protos: $(INSTALLED)
	$(PYTHON) tools/protos.py generate
	$(PYTHON) tools/manifests.py generate

proto-check: $(INSTALLED)
	$(PYTHON) tools/protos.py check

proto-lint: $(INSTALLED)
	$(PYTHON) tools/protos.py lint

proto-breaking: $(INSTALLED)
	$(PYTHON) tools/protos.py breaking $(AGAINST)

# Kubernetes manifests: regenerate their data files (Envoy's config, the demo
# model's config) after proto or config changes; render and validate every overlay.
manifests: $(INSTALLED)
	$(PYTHON) tools/manifests.py generate

manifests-check: $(INSTALLED)
	$(PYTHON) tools/manifests.py check

# Every path on all-MiniLM-L6-v2 against the machine's roofline (ARGS go to bench/run.py), then the decoder
# embedder and LLM reranker replicas against theirs; each writes its section of docs/benchmarks.md.
bench: $(INSTALLED)
	$(PYTHON) bench/run.py $(ARGS)
	$(PYTHON) bench/decoder_embedder.py
	$(PYTHON) bench/llm_reranker.py

.PHONY: images
# The images: sie-config, sie-gateway, sie-worker-cpu, sie-envoy (and sie-worker-cuda where its base is available),
# with podman, else docker; a Debian base made here where no registry answers (deploy/docker/build-images, which
# prints each image's size and build time). Needs no .venv. ARGS: targets, e.g. ARGS="gateway config".
images:
	deploy/docker/build-images $(ARGS)
