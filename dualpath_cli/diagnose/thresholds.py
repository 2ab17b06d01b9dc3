"""The troubleshooting workflows' thresholds, one named constant each.

Why one module: every threshold is documented, with its value and its reason, in
docs/troubleshooting.md (a test checks that each constant here is), and an operator reading
a finding looks its number up in one place.
"""

from __future__ import annotations

#: A condition is "persistent" when it holds in at least this share of the window's samples.
PERSIST_FRACTION = 0.5
#: Storage-NIC utilisation Max/Avg across the nodes of one role (seed 6.1; the paper's
#: balanced runs stay near 1.0-1.2).
SNIC_MAX_AVG_WARN = 1.3
SNIC_MAX_AVG_CRIT = 1.8
#: Below this mean utilisation a role's storage NICs are idle and their Max/Avg is noise.
SNIC_BUSY_MIN = 0.05
#: A node's storage-NIC bandwidth as a share of its role's median (a degraded link).
SNIC_BW_WARN = 0.75
SNIC_BW_CRIT = 0.5
#: A node whose storage NIC is this busy in most samples is saturated.
SNIC_SATURATED = 0.95
#: A change of alpha or the read side (audit log, controller step) is judged, reads to a slow
#: node before it against after it, when it happened inside the window or at most one window
#: length, and at least this many seconds, before its start (a re-check right after a fix).
CHANGE_REACH_MIN_S = 60.0
#: Fewest reads on each side of such a change for its before/after shares to be compared.
CHANGE_MIN_READS = 10
#: Share of an engine's decisions whose recorded class contradicts its inputs or the read
#: queue its node reported at the time.
MISCLASS_WARN = 0.1
#: TTFT P99/P50 over the window (seed 6.2: "P99 far above the mean").
TAIL_RATIO_WARN = 4.0
TAIL_RATIO_CRIT = 10.0
#: Fewest turns in the window for a TTFT quantile to mean anything.
TTFT_MIN_TURNS = 50
#: A block is hot when its busiest copy takes at least this share of the store's block
#: reads in the window (or, where the store's total is not reported, of the reported
#: blocks' reads), and it was read at least HOT_BLOCK_MIN_READS times (rule hot-block).
HOT_BLOCK_SHARE = 0.1
HOT_BLOCK_MIN_READS = 20
#: A hot block whose busiest copy takes this share of the store's block reads: CRITICAL (the
#: storage target holding it serves little else).
HOT_BLOCK_CRIT = 0.5
#: An engine is slow when its mean service time (busy seconds per batched request) over the
#: window is this multiple of its role peers' median, measured in at least
#: SLOW_SERVICE_MIN_SAMPLES samples.
SLOW_SERVICE_FACTOR = 2.0
SLOW_SERVICE_MIN_SAMPLES = 2
#: Prefills of a cached prefix that wait this long on average for their KV before they can
#: compute (the runtime loads the whole hit first): WARNING; CRITICAL at the second value.
KV_WAIT_WARN_S = 0.025
KV_WAIT_CRIT_S = 0.1
#: A node's store that takes this long on average per read batch (its service time: the
#: batch's I/O start to the store's return, queue wait and NIC pacing left out) over the
#: window: WARNING; CRITICAL at the second value. A batch is at most about 8 MiB (a reader's
#: share, storage/block_queue.py), a few ms from a healthy NVMe store or the page cache, so
#: 100 ms is a store 20x or more slower than it should be and 1 s one that barely serves.
#: Where service time is not reported (an older recording), the same values apply to a
#: block's mean read latency (queued to delivered), as before.
STORE_LATENCY_WARN_S = 0.1
STORE_LATENCY_CRIT_S = 1.0
#: An engine is slow/overloaded when its unfinished requests stay at this multiple of its
#: role peers' median (and at least SLOW_ENGINE_MIN_SEQ) in most samples.
SLOW_ENGINE_FACTOR = 3.0
SLOW_ENGINE_MIN_SEQ = 2
#: HBM fragmentation score (1 - largest free run / free).
HBM_FRAG_WARN = 0.5
HBM_FRAG_CRIT = 0.8
#: Load-ahead slack below minus this is a bubble (layer 0 of a prefill always waits a little).
BUBBLE_TOLERANCE_S = 0.002
#: Share of layers with a bubble that makes it critical.
BUBBLE_LAYERS_CRIT = 0.5
#: Prompt tokens of follow-up turns (turn >= 1) found cached; agent turns extend their own
#: prefix, so a low ratio means the prefix store or the session routing is failing.
PREFIX_HIT_WARN = 0.5
PREFIX_MIN_TURNS = 10
#: Prefetched blocks a later request used.
PREFETCH_ACCURACY_WARN = 0.5
#: Fewest prefetched blocks on a node for its accuracy to be judged.
PREFETCH_MIN_BLOCKS = 20
#: Scheduler FIFO growth (requests over the window) while engines have headroom.
FIFO_GROWTH_WARN = 20
ENGINE_HEADROOM_UTIL = 0.5
#: Prefill busy against decode busy (GPU utilisation) that says the P/D ratio is off.
PD_BUSY_HIGH = 0.85
PD_BUSY_LOW = 0.3
#: Prefill-bound also needs work waiting on the prefill side: at least this many unfinished
#: requests per prefill engine on average (one running, one waiting). A lone agent keeps its
#: PE busy and its DEs idle, yet more prefill nodes would not serve it faster.
PD_QUEUE_MIN = 2.0
#: Compute-NIC utilisation Max/Avg across nodes.
CNIC_MAX_AVG_WARN = 1.5
#: Cores the scheduler's service thread used over the window: every decision runs on that
#: one thread, so near 1.0 it, not the engines, caps throughput.
SCHED_CPU_WARN = 0.7
SCHED_CPU_CRIT = 0.9
#: A kind of scheduling call's p99 wall time over the mean gap between two arriving requests:
#: at 1.0 one slow call takes a whole gap, and requests queue behind the scheduler.
DECISION_P99_WARN = 0.5
DECISION_P99_CRIT = 1.0
#: Fewest timed scheduling calls of a kind in the window before its p99 is judged.
DECISION_MIN_CALLS = 20
#: The timed scheduling calls' wall seconds over the thread's CPU seconds in the window:
#: above it the calls mostly waited for a CPU (a loaded host, the GIL held by the launcher's
#: other threads), which hierarchical scheduling would not fix.
DECISION_WAIT_FACTOR = 1.5

# --- evidence minimums and hysteresis bands of the graded rules (diagnose/verdict.py) ------
#: Fewest samples for a per-sample rule (a link's rate, a share of samples) to grade: one
#: sample is a snapshot, not a guess (``dualpath top`` grades its first); the finding's why
#: says how many samples it stands on.
MIN_SAMPLES = 1
#: Hysteresis: with the previous verdict of a rule on a subject known, its value must pass a
#: threshold by more than the rule's band to change the grade (a steady fault measured a
#: little differently in each window keeps its grade).
SNIC_BW_BAND = 0.05
SNIC_MAX_AVG_BAND = 0.1
#: The band of the rules that grade a share of samples or of turns.
SHARE_BAND = 0.1
#: Fewest decisions of an engine before the share of them misclassed is judged.
MISCLASS_MIN_DECISIONS = 10
MISCLASS_BAND = 0.03
TAIL_RATIO_BAND = 0.5
SLOW_SERVICE_BAND = 0.2
HBM_FRAG_BAND = 0.05
#: Fewest samples of an engine that measured a KV wait before its mean is graded.
KV_WAIT_MIN_SAMPLES = 2
KV_WAIT_BAND_S = 0.005
#: Fewest store reads of a node in the window before their mean is graded (read batches
#: where the store's service time is graded, blocks where the read latency is).
STORE_LATENCY_MIN_READS = 10
#: With fewer in the window (the scheduler steers reads away from a slow store), how far
#: back store-latency may count the node's last reads, as earlier diagnose runs counted them.
STORE_LATENCY_LOOKBACK_S = 300.0
#: store-latency's band, a share of the threshold crossed (20 ms at WARNING's 100 ms, 200 ms
#: at CRITICAL's 1 s): a queued read's latency wobbles in proportion to it (a read behind a
#: burst of reads on a slow store waits for the burst), so one absolute band that is wide
#: enough at 100 ms is a fiftieth of the wobble at 1 s.
STORE_LATENCY_BAND = 0.2
SCHED_CPU_BAND = 0.05
#: The band of rule hot-block (its busiest copy's share of the store's reads).
HOT_BLOCK_BAND = 0.03
DECISION_P99_BAND = 0.1

# --- store health (diagnose/workflows/store_health.py) -------------------------------------
#: Share of a node's store reads in the window that failed (EIO, timed out): WARNING; at the
#: second value the node's store serves almost none of its cached prefixes (every one is
#: recomputed), CRITICAL. A healthy store fails no read, so one failed read is evidence
#: enough for WARNING (STORE_READ_MIN_READS); the claim that nearly every read fails needs
#: STORE_READ_CRIT_MIN_READS reads of the node (below it the grade is capped at WARNING).
STORE_READ_ERRORS_WARN = 0.02
STORE_READ_ERRORS_CRIT = 0.9
STORE_READ_ERRORS_BAND = 0.01
STORE_READ_MIN_READS = 1
STORE_READ_CRIT_MIN_READS = 10
#: Blocks found corrupt, and block writes the store refused, on one node in the window: any
#: is WARNING (no data is lost: a corrupt block is quarantined and recomputed, a block not
#: written is recomputed when next needed, but the store is failing or full). Counts are
#: whole, so the threshold is half a block with a band of a quarter: one event grades
#: WARNING from OK, none grades OK again.
STORE_EVENTS_WARN = 0.5
STORE_EVENTS_BAND = 0.25
#: Fewest samples for a count in the window (a counter's growth needs two looks).
STORE_MIN_SAMPLES = 2

# --- fabric (diagnose/workflows/fabric.py) ------------------------------------------------
#: Fabric: turns of an engine run again in the window because a KV message on its compute-
#: fabric link was lost. A healthy fabric loses none; a peer that died mid-send loses the
#: one or two turns it held (those are membership's), a link that is down loses every turn
#: it carries. Counts below the minimum are not graded.
KV_LOST_MIN_TURNS = 3
KV_LOST_WARN = 3
KV_LOST_BAND = 1
