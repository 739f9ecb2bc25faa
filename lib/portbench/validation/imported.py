"""A user's vLLM ``Scheduler`` subclass on the study's windows and regions: the virtual engine with their class.

``portbench simulate --vllm-scheduler mypkg.mod:MySched`` (or ``path/to/file.py:MySched``) imports the class,
checks it (:func:`load_class`), registers it under the name :func:`imported_name` (``vllm_mysched``) and runs it
inside the virtual engine (:mod:`.virtual`: vLLM's real KV manager, chunking and preemption; the campaign's cost
model in a virtual clock; a stub model) on the campaign's windows and regions, through the campaign's own
machinery (:class:`ImportedEngine`, a :class:`~.virtual_campaign.VirtualEngine`). Its runs are written as a
campaign of their own under ``{results_dir}/claims/runs/<name>/`` and read beside the frozen campaign's runs by
``portbench claim`` and the analysis.

**What the class gets.** vLLM 0.32's engine config with ``scheduling_policy="priority"`` (so a class that sets
``request.priority`` in ``add_request`` orders the waiting queue, ties by arrival time then request id), the
campaign profile's KV blocks, token budget and ``max_num_seqs``. Its requests are vLLM ``Request`` objects with
the trace's prompt length (token ids fabricated; prompts sharing the trace's hash blocks share tokens) and
``max_tokens`` = the request's *true* output length (the stub ends a request that way): a class that reads
``max_tokens`` reads an oracle, which it should declare (class attribute ``information = "oracle"``; the default
for an imported class is ``"oracle"`` unless it declares another of the registry's kinds -- not checked).

**Faults, each one message** (:class:`ImportedSchedulerError`): the module or class not found; a class that is
not a subclass of ``vllm.v1.core.sched.scheduler.Scheduler``; an exception inside the class (named with the
class, the step and the virtual time; the campaign adds the window, region and seed); two runs of the first
window with the same seed that differ (non-deterministic); a read of a model output the stub cannot give
(:data:`MODEL_FIELDS` of ``ModelRunnerOutput`` read by the class's own code: logprobs, pooled output, ...; the
sampled token ids are all the dummy token 1 and reading their *values* is not caught).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import sys
from pathlib import Path

from ..core import plugins
from ..core.errors import PortbenchError
from ..sim import schedulers as scheduler_registry
from ..sim.schedulers import BaseScheduler
from ..study import claim
from ..study.campaign import imported as campaign_imported
from ..study.campaign.engines import RunResult, scheduler_options
from ..sim import metrics
from . import virtual
from .virtual_campaign import VirtualEngine, prefix_caching_on
from ..vllm.options import SUPPORTED_VLLM

import portbench  # noqa: E402
import vllm  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler as VllmScheduler  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402

MODEL_FIELDS = ("logprobs", "prompt_logprobs_dict", "prompt_token_id_logprobs_dict", "pooler_output",
                "num_nans_in_logits", "aux_output_connector_output", "sampling_masks")
BASE = "vllm.v1.core.sched.scheduler.Scheduler"


class ImportedSchedulerError(PortbenchError):
    """A user's vLLM scheduler class cannot be run (the message names the class and the fix)."""


class NeedsModelOutput(ImportedSchedulerError):
    """The class read a model output the virtual engine's stub cannot give."""


def parse_spec(spec: str) -> tuple[str, str]:
    """``(module or file, class name)`` of ``mypkg.mod:MySched`` / ``path/file.py:MySched``."""
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise ImportedSchedulerError(f"--vllm-scheduler {spec!r}: expected MODULE:CLASS (e.g. mypkg.sched:MySched) or "
                                     "FILE.py:CLASS")
    mod, cls = spec.rsplit(":", 1)
    return mod, cls


def imported_name(spec: str) -> str:
    """The registry name of an imported class: ``vllm_`` + the class name in lower case."""
    parse_spec(spec)
    return campaign_imported.imported_name(spec)


def load_class(spec: str) -> type:
    """Import and check the class of ``spec`` (module docstring); ImportedSchedulerError otherwise."""
    mod_name, cls_name = parse_spec(spec)
    try:
        if mod_name.endswith(".py"):
            p = plugins.resolve(mod_name)
            plugins.load_spec(p)
            module = sys.modules[p.module]
        else:
            module = importlib.import_module(mod_name)
    except (ImportError, PortbenchError) as e:
        raise ImportedSchedulerError(f"vLLM scheduler {spec}: module {mod_name!r} cannot be imported here ({e}); "
                                     "install it in .venv-vllm or give FILE.py:CLASS") from None
    except Exception as e:  # noqa: BLE001 - the user's module failed while importing
        raise ImportedSchedulerError(f"vLLM scheduler {spec}: importing {mod_name!r} raised {type(e).__name__}: {e}") from None
    cls = getattr(module, cls_name, None)
    if cls is None:
        found = sorted(n for n, v in vars(module).items() if isinstance(v, type) and issubclass(v, VllmScheduler))
        raise ImportedSchedulerError(f"vLLM scheduler {spec}: no class {cls_name!r} in {mod_name!r}"
                                     + (f" (its Scheduler subclasses: {', '.join(found)})" if found else ""))
    if not isinstance(cls, type) or not issubclass(cls, VllmScheduler):
        bases = ", ".join(f"{b.__module__}.{b.__qualname__}" for b in getattr(cls, "__mro__", ())[1:3]) or type(cls).__name__
        raise ImportedSchedulerError(f"vLLM scheduler {spec}: {cls_name} is not a subclass of {BASE} (its bases: "
                                     f"{bases}); the virtual engine drives vLLM {SUPPORTED_VLLM}'s Scheduler "
                                     "internals, so derive from it (or from AsyncScheduler)")
    return cls


_OURS = tuple({str(p) for m in (vllm, portbench) for p in (Path(m.__file__).parent, Path(m.__file__).resolve().parent)})


def _user_frame(depth: int = 2) -> bool:
    """True when the caller ``depth`` frames up is outside vLLM, portbench and Python's own (the user's code)."""
    name = sys._getframe(depth).f_code.co_filename
    return not (name.startswith(_OURS) or name.startswith("<"))


class StubOutput(ModelRunnerOutput):
    """The stub's ModelRunnerOutput: reading a model field from the user's class raises :class:`NeedsModelOutput`."""

    _pb_class = "?"

    def __getattribute__(self, name):
        if name in MODEL_FIELDS and _user_frame():
            cls = type(self)._pb_class
            raise NeedsModelOutput(f"vLLM scheduler {cls}: reads model_runner_output.{name}, a model output the "
                                   "virtual engine's stub cannot give (it fabricates one dummy token per step and no "
                                   "logprobs or pooled output); such a class needs a real engine (portbench validate)")
        return object.__getattribute__(self, name)


class VirtualHooks:
    """What the virtual engine needs of a scheduler besides vLLM's interface (mixed in before the user's class)."""

    pb_driver = None
    pb_now = 0.0
    pb_spec = ""

    def _preempt_request(self, request, *args, **kwargs):
        self.__dict__.setdefault("_pb_pre", []).append(request.request_id)
        return super()._preempt_request(request, *args, **kwargs)

    def pb_take_preempted(self) -> list[str]:
        out = self.__dict__.get("_pb_pre", [])
        self.__dict__["_pb_pre"] = []
        return out

    def pb_configure(self, *args, **kwargs) -> None:
        return None


def virtual_class(spec: str) -> type:
    """The user's class with :class:`VirtualHooks` mixed in (what :func:`portbench.validation.virtual.run` builds)."""
    cls = load_class(spec)
    return type(f"Virtual{cls.__name__}", (VirtualHooks, cls), {"pb_spec": spec, "pb_output_cls": _stub_output(spec),
                                                               "pb_error": ImportedSchedulerError})


def _stub_output(spec: str) -> type:
    return type("StubOutput", (StubOutput,), {"_pb_class": spec})


def _placeholder(spec: str, information: str) -> type:
    name = imported_name(spec)

    class Imported(BaseScheduler):
        __doc__ = f"vLLM scheduler class {spec} (imported; runs on the virtual vLLM engine only)"
        models = f"user's vLLM Scheduler subclass {spec}"
        vllm_class = spec

        def priority(self, r, now):
            raise ImportedSchedulerError(f"{name} is a vLLM scheduler class ({spec}): it runs on the virtual vLLM "
                                         "engine (portbench simulate --vllm-scheduler), not on the simulator")

    Imported.name = name
    Imported.information = information
    Imported.__qualname__ = Imported.__name__ = f"Imported_{name}"
    return Imported


def register(spec: str) -> str:
    """Load and check ``spec``'s class and register its name in the scheduler registry; returns the name."""
    cls = load_class(spec)
    info = getattr(cls, "information", "oracle")
    if info not in scheduler_registry.INFORMATION:
        info = "oracle"
    scheduler_registry.register_scheduler(_placeholder(spec, info), replace=True)
    return imported_name(spec)


class ImportedEngine(VirtualEngine):
    """The campaign engine for imported classes: the class named ``name`` runs inside the virtual engine; every other
    scheduler as :class:`VirtualEngine` runs it."""

    def __init__(self, specs: dict[str, str] | None = None):
        super().__init__()
        self.specs = dict(specs or {})
        self._classes: dict[str, type] = {}

    def __getstate__(self):
        return {"specs": self.specs}

    def __setstate__(self, state):
        self.__init__(state.get("specs"))
        for spec in self.specs.values():      # a fresh worker process: register the names again
            register(spec)

    def fingerprint(self, sim) -> dict:
        out = dict(super().fingerprint(sim))
        out["vllm"] = virtual.check_version()
        out["imported"] = {n: {"spec": s, "sha256": _class_sha(s)} for n, s in sorted(self.specs.items())}
        return out

    def run(self, scaled_df, scheduler: str, seed: int, horizon_s: float, sim) -> RunResult:
        spec = self.specs.get(scheduler)
        if spec is None:
            return super().run(scaled_df, scheduler, seed, horizon_s, sim)
        prof = self.profile(sim)
        pc = prefix_caching_on(self, scaled_df, sim)

        def once():
            return virtual.run(scaled_df, scheduler, prof, horizon_s=horizon_s, seed=seed, slo=sim.edf_slo_dict,
                               options=scheduler_options(sim, scheduler), prefix_caching=pc,
                               hash_block_tokens=self.hash_block_size if pc else None, log_steps=False,
                               scheduler_cls=self._classes[scheduler])

        if scheduler not in self._classes:           # this process's first run of the class: run it twice
            self._classes[scheduler] = virtual_class(spec)
            check_deterministic(spec, lambda: once().requests, "the first window of this process")
        v = once()
        values = metrics.compute(v.requests, horizon_s, sim.slo_dicts)
        return RunResult(counters=dict(v.counters), metrics=dict(values), records=v.requests)


def _class_sha(spec: str) -> str:
    """SHA-256 of the class's module source (what the shard keys and the claim's report cite)."""
    cls = load_class(spec)
    try:
        src = Path(inspect.getsourcefile(cls) or "").read_bytes()
    except (OSError, TypeError):
        src = repr(cls).encode()
    return hashlib.sha256(src).hexdigest()


def check_deterministic(spec: str, run_once, where: str) -> None:
    """Run ``run_once()`` (a table of per-request records) twice; ImportedSchedulerError when they differ."""
    a, b = run_once(), run_once()
    if not a.equals(b):
        diff = [c for c in a.columns if not a[c].equals(b[c])]
        raise ImportedSchedulerError(f"vLLM scheduler {spec}: two runs of {where} with the same seed gave different "
                                     f"results ({', '.join(diff[:4])}): it draws randomness outside the run (random, "
                                     "numpy's global state, the clock, set iteration order ...); make its decisions a "
                                     "function of the requests and the scheduler's state, so that a run is reproducible")


REDUCED_WINDOWS = 10      # the default panel of an imported class: the first 10 windows of each panel source


def simulate(cfg, specs: list[str], *, panel: str | None = "real", windows_per_source: int | None = REDUCED_WINDOWS,
             progress: bool = True) -> list:
    """Run each imported class of ``specs`` on the panel's sources (None or ``all``: every source of ``cfg``), each
    in a campaign of its own (module docstring); returns the campaigns' results (runs under
    :func:`portbench.study.campaign.imported.runs_dir`)."""
    from ..study import campaign

    if panel in (None, "all"):
        sources = list(cfg.sources)
    else:
        sources = list(cfg.analysis.panels.get(panel) or [])
        if not sources:
            raise ImportedSchedulerError(f"--panel {panel!r}: all or one of the analysis' panels: "
                                         f"{', '.join(cfg.analysis.panels)}")
    out = []
    for spec in specs:
        name = register(spec)
        sub = claim.sub_config(cfg, [name], sources, windows_per_source, replicates=1)
        campaign.reuse_capacities(cfg, sub)
        out.append(campaign.run(sub, engine=ImportedEngine({name: spec}), progress=progress))
    return out
