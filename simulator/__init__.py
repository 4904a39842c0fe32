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

from __future__ import annotations

from simulator.common.version import __version__
from topologies.exports import lazy_exports

# The front door's names and the modules they live in, imported on first use: so
# ``import simulator`` (and the ``parasim`` command starting up) stays light.
_EXPORTS = {
    "load_scenario": "simulator.request.scenario",
    "run_scenario": "simulator.run.simulate",
    "Scenario": "simulator.request.scenario",
    "Recipe": "simulator.request.recipe",
    "StepResult": "simulator.analysis.result",
    "run_sweep": "simulator.tools.sweep",
    "run_scale": "simulator.tools.scale",
    "explain": "simulator.tools.explain",
}

__all__ = ["__version__", *_EXPORTS]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
