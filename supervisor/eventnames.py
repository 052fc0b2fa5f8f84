"""The daemon's vocabulary: every event name it writes to its log, its ledger and the journal.

One member per kind of event. Code emits a member (``daemon.event(EventName.GAVE_UP, ...)``) or
its string (``log.warning("checkpoint_quarantined", ...)``); either way the name must be a member
here: tests/test_eventnames.py scans the package's source and fails on a name that is not. Each
member has one journal ``MESSAGE_ID``, written literally in :mod:`supervisor.eventids`, so a
member's string can be renamed while ``journalctl MESSAGE_ID=...`` queries keep finding it.

Adding an event: one member here, in its area, and its ID line in eventids.py (docs/DEVELOPING.md,
"Adding an event"). Stdlib only, so that core/ may import it.
"""
from __future__ import annotations

import threading
from enum import StrEnum


class EventName(StrEnum):
    """An event name of the log, the ledger (``history``) and the journal (``TSUP_EVENT``)."""

    # --- the state machine (core/): launches, detections, decisions, the end
    CHECKPOINT_NONFINITE_AT_END = "checkpoint_nonfinite_at_end"
    DAEMON_EXITING = "daemon_exiting"
    DETECTION_NOTED = "detection_noted"
    DETECTION_WARNED = "detection_warned"
    FAILURE_DETECTED = "failure_detected"
    GAVE_UP = "gave_up"
    JOB_LEFTOVERS = "job_leftovers"
    JOB_STARTED = "job_started"
    RELAUNCH_HELD = "relaunch_held"
    RELAUNCH_RELEASED = "relaunch_released"
    REMEDIES_APPLIED = "remedies_applied"
    RESTART_REQUESTED = "restart_requested"
    RESTART_SCHEDULED = "restart_scheduled"
    RUN_UNWATCHED = "run_unwatched"
    SIGNAL_RECEIVED = "signal_received"
    STOP_REQUESTED = "stop_requested"
    # --- the daemon (daemon/): its life, concerns, the state dir, reloads, resume, validation
    # (restart_loop is said only to [notify]: several restart_scheduled in a short window)
    CONCERN_FAILED = "concern_failed"
    CONFIG_RELOADED = "config_reloaded"
    CONSOLE_OUTPUT_DROPPED = "console_output_dropped"
    DAEMON_START_FAILED = "daemon_start_failed"
    DAEMON_STARTED = "daemon_started"
    DIVERGENCE_PRECURSOR = "divergence_precursor"
    EVENT_NAME_UNKNOWN = "event_name_unknown"
    GOODPUT_HISTORY_UNREADABLE = "goodput_history_unreadable"
    GPU_BLIND = "gpu_blind"
    HANG_SUSPECTED = "hang_suspected"
    HEALTH_GATE = "health_gate"
    JOB_ISOLATION = "job_isolation"
    LEDGER_CHECKPOINT_FALLBACK = "ledger_checkpoint_fallback"
    LEDGER_METRICS_FAILED = "ledger_metrics_failed"
    LEDGER_WRITE_DELAYED = "ledger_write_delayed"
    LEDGER_WRITE_FAILED = "ledger_write_failed"
    LEDGER_WRITE_RECOVERED = "ledger_write_recovered"
    METRICS_DROPPED = "metrics_dropped"
    METRICS_FINAL_FAILED = "metrics_final_failed"
    METRICS_UNAVAILABLE = "metrics_unavailable"
    METRICS_UPDATE_FAILED = "metrics_update_failed"
    PART_CLOSE_FAILED = "part_close_failed"
    PREVIOUS_ATTEMPT_CLOSED = "previous_attempt_closed"
    RELOAD_IGNORED = "reload_ignored"
    RELOAD_NEEDS_RESTART = "reload_needs_restart"
    RELOAD_PARTIAL = "reload_partial"
    RELOAD_REJECTED = "reload_rejected"
    RESTART_LOOP = "restart_loop"
    RESUME_IGNORED = "resume_ignored"
    RESUME_INFERRED = "resume_inferred"
    RESUME_UNAVAILABLE = "resume_unavailable"
    ROOT_CAUSE_FOUND = "root_cause_found"
    ROOT_CAUSE_UNREADABLE = "root_cause_unreadable"
    RUN_COMMAND_CHANGED = "run_command_changed"
    RUNNER_HANDLER_FAILED = "runner_handler_failed"
    RUNNER_TICK_FAILED = "runner_tick_failed"
    SNAPSHOT_FAILED = "snapshot_failed"
    STACKS_DUMPED = "stacks_dumped"
    STACKS_UNAVAILABLE = "stacks_unavailable"
    STATE_CHANGED = "state_changed"
    STATE_DIR_LOST = "state_dir_lost"
    STATE_DIR_RETAKEN = "state_dir_retaken"
    STATE_DIR_UNUSABLE = "state_dir_unusable"
    STATUS_REFRESH_FAILED = "status_refresh_failed"
    VALIDATION_FAILED = "validation_failed"
    VALIDATION_PASSED = "validation_passed"
    VALIDATION_STARTED = "validation_started"
    # --- checkpoints: choice, verification, load tests, quarantine, keep-first
    CHECKPOINT_BACKGROUND_VERIFY_FAILED = "checkpoint_background_verify_failed"
    CHECKPOINT_BOOK_UNREADABLE = "checkpoint_book_unreadable"
    CHECKPOINT_CHOSEN = "checkpoint_chosen"
    CHECKPOINT_DIR_FOUND = "checkpoint_dir_found"
    CHECKPOINT_DIR_LISTING_CAPPED = "checkpoint_dir_listing_capped"
    CHECKPOINT_DIR_MOVED = "checkpoint_dir_moved"
    CHECKPOINT_DIR_UNKNOWN = "checkpoint_dir_unknown"
    CHECKPOINT_DISCOVERY_FAILED = "checkpoint_discovery_failed"
    CHECKPOINT_INTERVAL_ADVICE_FAILED = "checkpoint_interval_advice_failed"
    CHECKPOINT_LAST_GOOD_NOT_KEPT = "checkpoint_last_good_not_kept"
    CHECKPOINT_LAST_GOOD_SKIPPED = "checkpoint_last_good_skipped"
    CHECKPOINT_LOAD_TEST = "checkpoint_load_test"
    CHECKPOINT_LOAD_TEST_CANCELLED = "checkpoint_load_test_cancelled"
    CHECKPOINT_LOAD_TEST_TIMEOUT = "checkpoint_load_test_timeout"
    CHECKPOINT_MANIFEST_FALLBACK = "checkpoint_manifest_fallback"
    CHECKPOINT_MANIFEST_METRIC_NOT_WRITTEN = "checkpoint_manifest_metric_not_written"
    CHECKPOINT_MANIFEST_WRITTEN = "checkpoint_manifest_written"
    CHECKPOINT_MANIFESTS_ON = "checkpoint_manifests_on"
    CHECKPOINT_MARKED_BAD = "checkpoint_marked_bad"
    CHECKPOINT_NONE_READY = "checkpoint_none_ready"
    CHECKPOINT_NOT_KEPT = "checkpoint_not_kept"
    CHECKPOINT_NOT_READY = "checkpoint_not_ready"
    CHECKPOINT_PRESERVE_FAILED = "checkpoint_preserve_failed"
    CHECKPOINT_PRESERVED_LAST_GOOD = "checkpoint_preserved_last_good"
    CHECKPOINT_QUARANTINE_FAILED = "checkpoint_quarantine_failed"
    CHECKPOINT_QUARANTINED = "checkpoint_quarantined"
    CHECKPOINT_REFUSED_UNSAFE_PICKLE = "checkpoint_refused_unsafe_pickle"
    CHECKPOINT_REQUESTED = "checkpoint_requested"
    CHECKPOINT_RESTORED_LAST_GOOD = "checkpoint_restored_last_good"
    CHECKPOINT_SELECTION_FAILED = "checkpoint_selection_failed"
    CHECKPOINT_SUPERSEDED_BEFORE_VERIFIED = "checkpoint_superseded_before_verified"
    CHECKPOINT_VERIFIED_AFTER_LAUNCH = "checkpoint_verified_after_launch"
    CHECKPOINT_VERIFY_AFTER_LAUNCH_FAILED = "checkpoint_verify_after_launch_failed"
    DIGEST_CACHE_UNREADABLE = "digest_cache_unreadable"
    DIGEST_CACHE_UNWRITABLE = "digest_cache_unwritable"
    LOADTEST_CACHE_UNREADABLE = "loadtest_cache_unreadable"
    LOADTEST_CACHE_UNWRITABLE = "loadtest_cache_unwritable"
    WARM_VERIFIER_DIED = "warm_verifier_died"
    WARM_VERIFIER_IDLE = "warm_verifier_idle"
    WARM_VERIFIER_OFF = "warm_verifier_off"
    # --- the job's process, output, cgroup and shutdown (job/)
    CGROUP_LEFTOVERS_STOPPED = "cgroup_leftovers_stopped"
    JOB_CGROUP_NOT_ENTERED = "job_cgroup_not_entered"
    JOB_CGROUP_UNAVAILABLE = "job_cgroup_unavailable"
    JOB_LOG_ROTATE_FAILED = "job_log_rotate_failed"
    JOB_LOG_ROTATED = "job_log_rotated"
    JOB_STDERR_LOG_UNAVAILABLE = "job_stderr_log_unavailable"
    JOB_TREE_WALK_FAILED = "job_tree_walk_failed"
    PREWARM_OUTCOME = "prewarm_outcome"
    PREWARM_STANDBY_FAILED = "prewarm_standby_failed"
    MONITOR_FAILED = "monitor_failed"
    OUTPUT_CAUGHT_UP = "output_caught_up"
    OUTPUT_KEEPER_LOST = "output_keeper_lost"
    OUTPUT_KEEPER_RESTART_FAILED = "output_keeper_restart_failed"
    OUTPUT_KEEPER_RESTARTED = "output_keeper_restarted"
    OUTPUT_LINK_READ_FAILED = "output_link_read_failed"
    OUTPUT_PUMP_FAILED = "output_pump_failed"
    OUTPUT_UNPARSED = "output_unparsed"
    SHUTDOWN_CHECKPOINT_REQUESTED = "shutdown_checkpoint_requested"
    SHUTDOWN_CHECKPOINT_SEEN = "shutdown_checkpoint_seen"
    SHUTDOWN_CHECKPOINT_TIMEOUT = "shutdown_checkpoint_timeout"
    SHUTDOWN_ESCALATED = "shutdown_escalated"
    SHUTDOWN_FORCED = "shutdown_forced"
    SHUTDOWN_SIGNAL_SENT = "shutdown_signal_sent"
    SHUTDOWN_STRAGGLERS = "shutdown_stragglers"
    VERIFIER_CGROUP = "verifier_cgroup"
    # --- watching the job (watch/): output, heartbeats, metric files, hangs
    ANOMALY_DETECTED = "anomaly_detected"
    HANG_DETECTED = "hang_detected"
    HANG_LOOK_FAILED = "hang_look_failed"
    HANG_LOOK_STARTED = "hang_look_started"
    HANG_SUSPICION_OVER = "hang_suspicion_over"
    HEARTBEAT_FIRST = "heartbeat_first"
    HEARTBEAT_TIMEOUT_LEARNED = "heartbeat_timeout_learned"
    LOGWATCH_EMIT_FAILED = "logwatch_emit_failed"
    LOGWATCH_FAILED = "logwatch_failed"
    LOGWATCH_LINE_FAILED = "logwatch_line_failed"
    LOGWATCH_METRIC_SINK_FAILED = "logwatch_metric_sink_failed"
    METRIC_FILE_CORRUPT_RECORD = "metric_file_corrupt_record"
    METRIC_FILE_FOLLOWED = "metric_file_followed"
    METRIC_FILE_IGNORED = "metric_file_ignored"
    METRIC_FILE_LINE_SKIPPED = "metric_file_line_skipped"
    METRIC_FILE_LINK_REFUSED = "metric_file_link_refused"
    METRIC_FILE_REEXAMINED = "metric_file_reexamined"
    METRIC_FILE_TRUNCATED = "metric_file_truncated"
    METRIC_FILE_UNREADABLE = "metric_file_unreadable"
    METRIC_FILES_INOTIFY_UNAVAILABLE = "metric_files_inotify_unavailable"
    METRIC_FILES_ROOT_ADDED = "metric_files_root_added"
    METRIC_FILES_SCAN_CAPPED = "metric_files_scan_capped"
    METRIC_FILES_SCAN_FAILED = "metric_files_scan_failed"
    METRIC_FILES_SINK_FAILED = "metric_files_sink_failed"
    METRICS_BLIND = "metrics_blind"
    METRICS_SEEN = "metrics_seen"
    EVAL_NONFINITE = "eval_nonfinite"
    NAN_MENTIONED = "nan_mentioned"
    OUTPUT_LIVENESS_OFF = "output_liveness_off"
    OUTPUT_LIVENESS_ON = "output_liveness_on"
    STEP_TIMEOUT_LEARNED = "step_timeout_learned"
    TAIL_FILE_FOLLOWED = "tail_file_followed"
    TAIL_FILE_GONE = "tail_file_gone"
    TAIL_FILE_TRUNCATED = "tail_file_truncated"
    TAIL_INOTIFY_UNAVAILABLE = "tail_inotify_unavailable"
    TAIL_INOTIFY_WATCH_FAILED = "tail_inotify_watch_failed"
    TAIL_SCAN_FAILED = "tail_scan_failed"
    TAIL_SINK_FAILED = "tail_sink_failed"
    # --- host and GPU health (health/)
    GATE_FAILED = "gate_failed"
    GATE_PASSED = "gate_passed"
    GATE_WAITING_FOR_GPU_MEMORY = "gate_waiting_for_gpu_memory"
    GPU_DETECTION = "gpu_detection"
    GPU_EVENT_WAIT_LOST = "gpu_event_wait_lost"
    GPU_EVENTS_FAILED = "gpu_events_failed"
    GPU_EVENTS_REGISTERED = "gpu_events_registered"
    GPU_EVENTS_UNSUPPORTED = "gpu_events_unsupported"
    GPU_MONITOR_ERROR = "gpu_monitor_error"
    GPU_MONITOR_STARTED = "gpu_monitor_started"
    GPU_ON_BLIND_CALLBACK_FAILED = "gpu_on_blind_callback_failed"
    GPU_DEVICE_UNKNOWN = "gpu_device_unknown"
    GPU_EVENTS_STALE = "gpu_events_stale"
    GPU_XID_FOREIGN = "gpu_xid_foreign"
    GPU_DEVICES_RESOLVED = "gpu_devices_resolved"
    HOST_DETECTION = "host_detection"
    HOST_MEMORY_LOW = "host_memory_low"
    HOST_MONITOR_ERROR = "host_monitor_error"
    STORAGE_PROBE_CLEANUP_FAILED = "storage_probe_cleanup_failed"
    # --- operations (ops/): control socket, metrics endpoint, sd_notify, notifications
    CONTROL_HANDLER_FAILED = "control_handler_failed"
    CONTROL_PEER_REFUSED = "control_peer_refused"
    CONTROL_PEER_REFUSED_SUPPRESSED = "control_peer_refused_suppressed"
    CONTROL_SOCKET_LISTENING = "control_socket_listening"
    CONTROL_SOCKET_STALE_REMOVED = "control_socket_stale_removed"
    METRICS_CONNECTIONS_CAPPED = "metrics_connections_capped"
    METRICS_LISTENING = "metrics_listening"
    METRICS_LINGER = "metrics_linger"
    METRICS_LINGER_ENDED = "metrics_linger_ended"
    METRICS_TEXTFILE_FAILED = "metrics_textfile_failed"
    METRICS_TEXTFILE_NAME_TAKEN = "metrics_textfile_name_taken"
    NOTIFY_ABANDONED = "notify_abandoned"
    NOTIFY_DROPPED = "notify_dropped"
    NOTIFY_FAILED = "notify_failed"
    NOTIFY_HELD_BACK = "notify_held_back"
    NOTIFY_INTERNAL_ERROR = "notify_internal_error"
    NOTIFY_QUEUE_RECOVERED = "notify_queue_recovered"
    NOTIFY_READY = "notify_ready"
    NOTIFY_RECOVERED = "notify_recovered"
    NOTIFY_REDIRECT_REFUSED = "notify_redirect_refused"
    SD_NOTIFY_FAILED = "sd_notify_failed"
    WEB_CONNECTIONS_CAPPED = "web_connections_capped"
    WEB_LISTENING = "web_listening"
    WEB_REQUEST_FAILED = "web_request_failed"
    WEB_UNAVAILABLE = "web_unavailable"
    # --- multi-node runs (cluster/)
    CLUSTER_AGENT_FAILED = "cluster_agent_failed"
    CLUSTER_COMMAND_FAILED = "cluster_command_failed"
    CLUSTER_END_REQUEST_FAILED = "cluster_end_request_failed"
    CLUSTER_ETCD_BACK = "cluster_etcd_back"
    CLUSTER_ETCD_UNREACHABLE = "cluster_etcd_unreachable"
    CLUSTER_EXPLICIT_CHECKPOINT_IGNORED = "cluster_explicit_checkpoint_ignored"
    CLUSTER_FINISH_UNRECORDED = "cluster_finish_unrecorded"
    CLUSTER_GENERATION_END_FOLDED = "cluster_generation_end_folded"
    CLUSTER_GENERATION_END_REQUESTED = "cluster_generation_end_requested"
    CLUSTER_GENERATION_ENDED = "cluster_generation_ended"
    CLUSTER_GENERATION_JOINED = "cluster_generation_joined"
    CLUSTER_KEY_IGNORED = "cluster_key_ignored"
    CLUSTER_LAUNCH_AGREED = "cluster_launch_agreed"
    CLUSTER_LAUNCH_DIGEST_FAILED = "cluster_launch_digest_failed"
    CLUSTER_LAUNCH_MISMATCH = "cluster_launch_mismatch"
    CLUSTER_LEADER = "cluster_leader"
    CLUSTER_LEASE_LOST = "cluster_lease_lost"
    CLUSTER_LEAVE_FAILED = "cluster_leave_failed"
    CLUSTER_PACKAGE_PROBE_FAILED = "cluster_package_probe_failed"
    CLUSTER_PLAN_WRITTEN = "cluster_plan_written"
    CLUSTER_STARTED = "cluster_started"
    CLUSTER_WATCH_COMPACTED = "cluster_watch_compacted"
    CLUSTER_WATCH_DROPPED = "cluster_watch_dropped"
    CLUSTER_WATCH_OPEN = "cluster_watch_open"
    CLUSTER_WATCH_REFUSED = "cluster_watch_refused"
    CLUSTER_WATCH_UNOPENED = "cluster_watch_unopened"
    # --- the run report (report/)
    REPORT_PLOT_FAILED = "report_plot_failed"
    REPORT_PLOT_SKIPPED = "report_plot_skipped"
    REPORT_WRITTEN = "report_written"


#: Members emitted under a name computed at run time, which the source scan cannot see as a
#: literal (none today: every member is written literally where it is emitted).
DYNAMIC: frozenset[EventName] = frozenset()


def member(name: str) -> EventName | None:
    """The member of a name, or None for a name outside the vocabulary (a library's log line)."""
    try:
        return EventName(name)
    except ValueError:
        return None


class UnknownNames:
    """The names outside the vocabulary met so far, so that each is reported once (thread-safe:
    monitors emit from their own threads)."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def first_time(self, name: str) -> bool:
        """True the first time ``name`` is met and is not a member; False otherwise."""
        if member(name) is not None:
            return False
        with self._lock:
            if name in self._seen:
                return False
            self._seen.add(name)
            return True


__all__ = ["DYNAMIC", "EventName", "UnknownNames", "member"]
