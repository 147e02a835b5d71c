# make lab   set everything up and open the course in Jupyter Lab
# make test  set everything up and run what CI runs: ruff, unit and learning tests, every notebook in fast mode
# make full  run every notebook in full mode, in place (the outputs and figures students see)
# make site  render every notebook as stored (no execution) to static HTML in site/, with an index
# make exercises  the student versions of the notebooks with exercises (solutions replaced by stubs, no outputs)
#                 in exercises/, made by nbgrader's preprocessors
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU wheel on the course machines; elsewhere `make test TORCH=torch` takes your platform's build.
TORCH ?= torch==2.13.0
# torch's idle threads sleep instead of spinning, so a busy laptop does not make them crawl (minirl/course.py).
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: venv lab test full site exercises clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)" -e ".[dev]"
	$(BIN)/python -m ipykernel install --sys-prefix --name minirl --display-name "Python (minirl)" \
		--env OMP_WAIT_POLICY PASSIVE
	touch $@

venv: $(BIN)/.installed

lab: venv
	$(BIN)/jupyter lab notebooks/00_welcome.ipynb

test: venv
	$(BIN)/ruff check .
	MINIRL_FAST=1 $(BIN)/pytest --durations=10 tests
	MINIRL_FAST=1 $(BIN)/pytest --nbval-lax --nbval-current-env --durations=10 notebooks

full: venv
	MINIRL_FAST=0 $(BIN)/jupyter nbconvert --to notebook --execute --inplace \
		--ExecutePreprocessor.timeout=1800 --ExecutePreprocessor.kernel_name=minirl notebooks/*.ipynb

site: venv
	$(BIN)/python tools/build_site.py --out site

exercises: venv
	$(BIN)/python tools/exercises.py notebooks exercises

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
