VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test demo lint histories clean safety safety-ci safety-mutants

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test: $(STAMP) lint
	@command -v kubectl >/dev/null 2>&1 || echo "kubectl is not on the PATH: the kubectl conformance tests (tests/sim/test_kubectl.py) do not run (apt-get install kubectl)"
	@command -v promtool >/dev/null 2>&1 || echo "promtool is not on the PATH: the alert rules' promtool tests (tests/deploy/test_monitoring.py) do not run (apt-get install prometheus)"
	$(VENV)/bin/pytest -q

demo: $(STAMP)
	$(VENV)/bin/gpuheal demo

# Re-record tests/histories/ from the dev server (the replay tests read them).
histories: $(STAMP)
	$(PY) -m tests.workflows.record_histories

clean:
	rm -rf $(VENV) .gpuheal

# The safety simulation (sim/safety): seeded random schedules over the real workflows on the
# time-skipping server, invariants checked over every side effect. SEED=n replays one schedule.
SCHEDULES ?= 20000
safety: $(STAMP)
	$(PY) -m sim.safety $(if $(SEED),--seed $(SEED),--schedules $(SCHEDULES)) $(if $(MUTANT),--mutant $(MUTANT))

# CI's 300 schedules with every invariant (part of `make test`; this runs them alone).
safety-ci: $(STAMP)
	$(VENV)/bin/pytest -q -s tests/sim/test_safety.py -k ci_schedules

# Each safeguard switched off in turn (sim/safety/mutants.py): the simulation must find a violation.
safety-mutants: $(STAMP)
	SAFETY_MUTANTS=1 $(VENV)/bin/pytest -q -s tests/sim/test_safety.py -k safeguard
