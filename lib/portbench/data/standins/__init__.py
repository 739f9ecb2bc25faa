"""Labelled stand-ins for BurstGPT and Bailian, evidence comparisons, and counterfactual windows.

The official BurstGPT and Bailian/Qwen files are not available here (``../shared/traces/
PROVENANCE.md``). A *stand-in* is a synthetic workload built from the real evidence that is:
every stand-in window is flagged ``synthetic: True``, carries provenance ``standin`` and is shown
as e.g. "BurstGPT (stand-in)" (``sources.label``). Its results describe the stand-in, not the trace.

**BurstGPT stand-in** (generator :data:`BURSTGPT_GENERATOR`), from the mirror's real slices
(``standins.burstgpt.slices``: the first 400 rows of ``BurstGPT_1.csv`` and of ``BurstGPT_3.csv``):

* lengths and tenants: (prompt, output, model, log type) rows resampled with replacement from the
  slices' valid rows, read by the canonical BurstGPT adapter (``traces.read_file``: failures, i.e.
  0 response tokens, excluded and counted); tenant = ``"<model>/<log type>"`` as for real BurstGPT
  windows.
* arrivals: a Gamma renewal process (the BurstGPT paper's arrival model). The slices cover the
  first ~10 hours of two files at ~35 requests/hour, far below the full files' mean rates (959 and
  2,628 requests/hour for without_fails_1 and _2, from the guanxi data-quality table), so their
  rate describes a quiet night, not the trace. Their 1-second timestamp resolution adds a variance
  of 1/6 s^2 to gaps of ~100 s, negligible for the CV (``estimates`` reports the size), while at
  full-file rates it would create ties. Choice: **rate = the full-file mean rate of the configured
  official file** (``sources.burstgpt.file``; ``rate: slices`` uses the slices' rate instead).
  Windows are rescaled to target loads later, so the relative burst pattern (the CV) is what
  matters. **CV**: the raw pooled CV of the within-slice gaps (~3.7) is dominated by a few long
  gaps of the night-to-morning ramp at the start of each file: it mixes a slow rate change into
  burstiness, and a Gamma renewal process with that CV puts ~70 % of its gaps below a tenth of the
  mean, while the slices' own 200-request windows show CVs of about 1-4 (median ~2). Choice
  (``cv: window``): the CV of the gaps divided by their centred moving mean over ``windows.size``
  gaps, i.e. burstiness at the scale of one window, net of slower rate changes; it assumes the
  burst pattern per ``windows.size`` requests carries over from the slices' ~35 req/h to the full
  file's rate (no evidence at that rate is available). ``cv: pooled`` uses the raw pooled CV.
  Both come with 95 % moving-block bootstrap CIs (``bootstrap`` resamples, blocks of
  ``block_length`` gaps so bursts stay together; i.i.d. CIs are reported beside them).
* log types: the slices are Conversation-log-heavy (398/400 and 394/400) while the full files are
  API-heavy (e.g. 97.9 % API in without_fails_2). Choice: **no reweighting by default**
  (``reweight_log_types: false``): the slices hold only 8 valid API rows, so weighting them to
  the full-file share would make ~98 % of the stand-in's requests copies of 8 pairs. The stand-in
  therefore represents BurstGPT's Conversation-log traffic; :func:`evidence_tables` shows how far
  its lengths are from the full-file aggregates (which are shorter: API requests dominate them),
  and shows the reweighted variant beside it.

**Bailian stand-in** (generator :data:`BAILIAN_GENERATOR`), from ServeGen's ``language/m-small``
statistics of Bailian production (``standins.bailian.servegen_dir``): per client a
``chunk-N-trace.csv`` (2,016 windows of 600 s over 14 days: start, rate, CV, pattern, shape, scale)
and a ``chunk-N-dataset.json`` (6-hour buckets of input/output token PMFs, stored as text of a
dict, parsed with ``ast.literal_eval``). Clients without a dataset file are excluded and counted;
they include the largest clients (``estimates`` reports their share of the requests), so the
stand-in represents the traffic mix of the remaining clients.
A window starts at a time stride-sampled over the 14 days (one seeded uniform point per equal
time bucket). From there every client active in the current 600-s window (rate > 0) is a
*stationary* renewal process with that window's rate and CV; the pattern column picks the family
(Gamma: shape 1/CV^2; Weibull: shape solved for the CV). The recorded shape/scale columns are not
used: for Weibull windows the recorded shape is a separate fit whose CV differs from the
window's measured CV (``estimates`` reports by how much), and the recorded scales are not in
units of the window's rate. Clients are superposed; at each 600-s boundary the process continues
with the next window's active clients and parameters (each segment starts in equilibrium; the data
say nothing about the joins) until ``windows.size`` requests are collected. Each request's input
and output tokens are drawn independently (the data give only marginals) from its client's PMFs
of the latest non-empty 6-hour bucket at or before its 600-s window (ServeGen's own rule);
0-token bins are dropped and the PMF renormalised. Tenant = ``"client-<N>"``.

**Freezing.** :func:`build_windows` returns ``(meta, df)`` per window; ``meta["generator"]`` =
``{name, params, seed}`` with everything needed to rebuild (rate, CV, sizes, start time, client
list, evidence checksums), the per-window seed derived from ``standins.seed``, the source name and
the window index through ``numpy.random.SeedSequence``. :func:`regenerate` rebuilds a window from
that record and the evidence files, after checking their SHA-256 (``IntegrityError`` otherwise).

**Counterfactuals** (:func:`counterfactual`): ``burstiness`` (same requests and span, gaps redrawn
from a Gamma renewal process with a target CV), ``lengths`` (another source's (prompt, output)
pairs resampled into the same arrivals), ``load`` (rate x factor, pattern kept).
"""

from .bailian import ServeGenData, load_servegen, read_qwen_rows, servegen_folder
from .build import build_windows, regenerate
from .burstgpt import BurstGPTEvidence, burstgpt_arrival_estimates, burstgpt_evidence, real_burstgpt_windows, \
    window_normalised_gaps
from .common import (PERCENTILES, BAILIAN_GENERATOR, BURSTGPT_GENERATOR, STANDIN_SOURCES, StandinInputs, evidence_sha256, inputs,
                     mirror_of, verify_evidence, window_seed)
from .counterfactual import COUNTERFACTUAL_KINDS, burstiness_comparison, counterfactual
from .evidence import estimates, evidence_tables, real_slices, standin_windows

__all__ = [
    "BAILIAN_GENERATOR", "BURSTGPT_GENERATOR", "PERCENTILES", "COUNTERFACTUAL_KINDS", "STANDIN_SOURCES", "BurstGPTEvidence",
    "ServeGenData", "StandinInputs", "build_windows", "burstgpt_arrival_estimates", "burstgpt_evidence",
    "burstiness_comparison", "counterfactual", "estimates", "evidence_sha256", "evidence_tables", "inputs",
    "load_servegen", "mirror_of", "read_qwen_rows", "real_burstgpt_windows", "real_slices", "regenerate", "servegen_folder",
    "standin_windows", "verify_evidence", "window_normalised_gaps", "window_seed",
]
