"""The attribution's design: source pairs, players (properties or groups), subsets, windows, regions, metrics."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import combinations

import numpy as np

from ...core.config import AnalysisConfig, AttributionConfig, CampaignConfig, SimulationConfig
from ...core.errors import DataError, ParameterError
from ...data import hybrids
from ...data import windows as windows_mod
from ...sim import schedulers as scheduler_registry
from ..analysis import metric_names

# The all-real panel (issue #13): the default pairs once these sources are configured and frozen.
REAL_PANEL = ("azure", "azure_code", "mooncake")


@dataclass(frozen=True)
class Design:
    """Everything that fixes what the attribution simulates and compares (from ``cfg.attribution`` and the
    manifest): ordered source pairs (A, B), the players (groups of properties), the regions and their
    loads, windows per source, replicates, schedulers, the compared metrics and the tie/distance settings."""

    pairs: tuple[tuple[str, str], ...]
    players: tuple[tuple[str, ...], ...]
    regions: dict
    windows: int
    replicates: tuple[int, ...]
    schedulers: tuple[str, ...]
    metrics: tuple[str, ...]
    metrics_note: str
    bootstrap: int
    seed: int
    distance: str

    @property
    def k(self) -> int:
        return len(self.players)

    @property
    def player_names(self) -> list[str]:
        return ["+".join(g) for g in self.players]

    @property
    def active(self) -> list[int]:
        """The players that can matter: those that swap at least one window property. A player that swaps only
        ``load`` is the identity (both sources run at the region's rho on their own sustainable throughput), so
        its Shapley value is 0 by construction; the reported game leaves it out (:func:`subgame`), which changes
        no other player's value (a dummy player's absence leaves the others' Shapley values as they are)."""
        return [i for i, g in enumerate(self.players) if any(p in hybrids.WINDOW_PROPERTIES for p in g)]

    @property
    def active_names(self) -> list[str]:
        return [self.player_names[i] for i in self.active]

    @property
    def dropped_names(self) -> list[str]:
        return [p for i, p in enumerate(self.player_names) if i not in self.active]

    def subgame(self, v) -> np.ndarray:
        """The game ``v`` ``(2^k, ...)`` on the players that can matter ``(2^len(active), ...)``: subset ``t`` of
        the active players is the design's subset of the same players (the dropped ones unswapped)."""
        act = self.active
        masks = [sum(1 << i for j, i in enumerate(act) if t >> j & 1) for t in range(2 ** len(act))]
        return np.asarray(v)[masks]

    @property
    def masks(self) -> list[int]:
        """Every subset of players as a bit mask (bit i = player i swapped): 0 = A, ``2^k - 1`` = B."""
        return list(range(2 ** self.k))

    @property
    def full(self) -> int:
        return 2 ** self.k - 1

    def swap(self, mask: int) -> tuple[str, ...]:
        """The properties swapped by the subset ``mask`` (in :data:`~portbench.data.hybrids.PROPERTIES` order)."""
        props = [p for i, g in enumerate(self.players) if mask >> i & 1 for p in g]
        return hybrids.check_properties(props, "attribution.properties")

    def code(self, mask: int) -> str:
        """``"none"`` (= A), the swapped properties joined with '+', or ``"all"`` (= B)."""
        if mask == 0:
            return "none"
        if mask == self.full:
            return "all"
        return "+".join(self.swap(mask))

    def players_of(self, mask: int) -> str:
        """The players of the subset ``mask`` joined with ' & ' (``"none"`` for the empty subset)."""
        return " & ".join(p for i, p in enumerate(self.player_names) if mask >> i & 1) or "none"

    @property
    def window_parts(self) -> int:
        """Distinct window-property swaps among the subsets: the hybrids simulated per window pair (``load`` is
        the identity, so a subset with it shares the runs of the same subset without it)."""
        return len({tuple(p for p in self.swap(m) if p in hybrids.WINDOW_PROPERTIES) for m in self.masks})

    def n_runs(self, n_pairs: int | None = None) -> int:
        """Runs labelled by subset (``runs.parquet``: every subset, window, region, scheduler, replicate)."""
        n = len(self.pairs) if n_pairs is None else n_pairs
        return n * 2 ** self.k * self.windows * len(self.regions) * len(self.schedulers) * len(self.replicates)

    def n_simulated(self, n_pairs: int | None = None) -> int:
        """Runs simulated (every window-hybrid, window, region, scheduler, replicate); at most, since a
        swap that happens to change nothing shares the runs of the hybrid it equals."""
        n = len(self.pairs) if n_pairs is None else n_pairs
        return n * self.window_parts * self.windows * len(self.regions) * len(self.schedulers) * len(self.replicates)


def cost_plan(campaign: CampaignConfig, sim: SimulationConfig, design: Design, manifest: Mapping) -> dict:
    """The one computation of every stated cost (summary.json, notebook 09, ``portbench attribute``): the
    dimensions, subsets and runs of ``design`` and of the **full design** -- the five properties as separate
    players (32 subsets, of which 16 distinct window-hybrids: ``load`` is the identity), every campaign window
    of the pair's sources (the fewer of the two), every region of ``simulation.region_loads`` and the
    campaign's replicates (``simulation.replicates``), for the same pairs and schedulers."""
    n_win = min(len(windows_mod.select_entries(manifest, [s], campaign.windows_per_source))
                for p in design.pairs for s in p)
    design = replace(design, windows=min(design.windows, n_win))      # pair_windows takes at most the campaign's
    full = replace(design, players=tuple((p,) for p in hybrids.PROPERTIES), windows=n_win,
                   regions=dict(sim.region_loads), replicates=tuple(range(int(sim.replicates))))

    def dims(d: Design) -> dict:
        return {"pairs": len(d.pairs), "players": d.player_names, "subsets": 2 ** d.k, "window_hybrids": d.window_parts,
                "windows": d.windows, "regions": list(d.regions), "schedulers": len(d.schedulers),
                "replicates": len(d.replicates), "runs": d.n_runs(), "simulated_runs": d.n_simulated()}
    return {"design": dims(design), "full": dims(full)}


def available_sources(manifest: Mapping) -> list[str]:
    """Sources with windows in the manifest, in manifest order."""
    out: list[str] = []
    for w in manifest.get("windows", []):
        if w["source"] not in out:
            out.append(w["source"])
    return out


def resolve_pairs(pairs, available: Sequence[str], panelled: Sequence[str] | None = None) -> list[tuple[str, str]]:
    """The ordered pairs (A, B): ``pairs`` as given (each source must have windows), or for ``"auto"`` every
    pair of the all-real panel :data:`REAL_PANEL` when all three have windows, else the first of azure /
    the first source against every other source. With ``auto``, a source of the user's own (with windows, in no
    configured panel: ``panelled`` lists the sources of ``analysis.panels``) is paired with every source of the
    all-real panel that has windows (else with the first source), so the attribution answers for it too."""
    if pairs != "auto":
        for i, p in enumerate(pairs):
            for s in p:
                if s not in available:
                    raise ParameterError(f"attribution.pairs[{i}]", list(p), f"sources with frozen windows "
                                         f"({', '.join(available)})")
        return [tuple(p) for p in pairs]
    own = [s for s in available if panelled is not None and s not in panelled and s not in REAL_PANEL]
    if len(own) == len(available):      # only sources of one's own: each against the first (the rule below)
        own = []
    if all(s in available for s in REAL_PANEL):
        base = list(combinations(REAL_PANEL, 2))
    else:
        if len(available) < 2:
            raise DataError("manifest", f"attribution needs two sources with windows, found {list(available)}")
        first = "azure" if "azure" in available else available[0]
        base = [(first, s) for s in available if s != first and s not in own]
    real = [s for s in REAL_PANEL if s in available] or [s for s in available if s not in own][:1]
    return base + [(r, s) for s in own for r in real if (r, s) not in base]


def spaced(n: int, k: int) -> list[int]:
    """``k`` indices evenly spaced over ``0 .. n-1`` (all of them when ``k >= n``)."""
    if k >= n:
        return list(range(n))
    return sorted({int(round(x)) for x in np.linspace(0, n - 1, k)})


def compared_metrics(analysis: AnalysisConfig, sim: SimulationConfig) -> tuple[tuple[str, ...], str]:
    """The metrics the attribution ranks on: ``analysis.headline_metrics`` (the pre-specified list; the one
    place they are defined), or every analysed metric when that list is empty; and a note saying which."""
    names = metric_names(sim.slo)
    head = tuple(analysis.headline_metrics)
    if head:
        return head, "the analysis' headline metrics, analysis.headline_metrics"
    ms = names if analysis.metrics == "all" else list(analysis.metrics)
    return tuple(ms), "every analysed metric: analysis.headline_metrics is empty"


def make_design(a: AttributionConfig, sim: SimulationConfig, analysis: AnalysisConfig, manifest: Mapping) -> Design:
    """The :class:`Design` of the ``attribution`` section (with the simulation's regions and schedulers and the
    analysis' metrics and panels) for the sources frozen in ``manifest``."""
    for i, r in enumerate(a.regions):
        if r not in sim.region_loads:
            raise ParameterError(f"attribution.regions[{i}]", r, f"one of {', '.join(sim.region_loads)}")
    regions = dict(sorted(((r, float(sim.region_loads[r])) for r in a.regions), key=lambda kv: (kv[1], kv[0])))
    metrics, note = compared_metrics(analysis, sim)
    panelled = [x for srcs in analysis.panels.values() for x in srcs] or None
    return Design(pairs=tuple(resolve_pairs(a.pairs, available_sources(manifest), panelled)), players=tuple(a.properties),
                  regions=regions, windows=int(a.windows), replicates=tuple(range(int(a.replicates))),
                  schedulers=tuple(scheduler_registry.names(sim.schedulers)), metrics=metrics,
                  metrics_note=note, bootstrap=int(a.bootstrap), seed=int(a.seed), distance=a.distance)
