"""parasim's simulator: predict how a training step behaves when split across GPUs.
Imports no torch.

The front door, for use from Python::

    import simulator

    scenario = simulator.load_scenario("scenarios/llama3-8b.yaml", ["parallel.tp=2"])
    run = simulator.run_scenario(scenario)          # RunResult: schedule, times, result
    print(scenario.recipe, run.result.step_time_s)  # the Recipe, the StepResult
    ranked = simulator.run_sweep("scenarios/small.yaml")
    findings = simulator.explain("scenarios/teaching/layering-mistake.yaml")

Everything else lives in the layers below (``docs/guide.md``, "The code, layer by
layer") and is imported from its module.
"""

from simulator.analysis.result import StepResult
from simulator.common.version import __version__
from simulator.request.recipe import Recipe
from simulator.request.scenario import Scenario, load_scenario
from simulator.run.simulate import run_scenario
from simulator.tools.explain import explain
from simulator.tools.scale import run_scale
from simulator.tools.sweep import run_sweep

__all__ = [
    "__version__",
    "load_scenario",
    "run_scenario",
    "Scenario",
    "Recipe",
    "StepResult",
    "run_sweep",
    "run_scale",
    "explain",
]
