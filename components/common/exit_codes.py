"""The exit codes of every stage, in one place. Kubernetes, KFP retries and the TFJob `ExitCode` restart policy
read them: 1-127 are final, 128 and above retryable."""

SUCCESS = 0
FAILED = 1  # final: a NaN, a failed job, workers that never came; retrying would fail the same way
BAD_INPUT = 2  # final: the error line says which file, field or value to fix
TIMED_OUT = 124  # final: a followed run (make run WAIT=1) did not end in time; it goes on (timeout(1)'s code)
INTERRUPTED = 130  # a person's Ctrl-C ended a command (128 + SIGINT); what it saved is said on the way out
PREEMPTED = 143  # 128 + SIGTERM, retryable: the retry resumes from the checkpoint saved before exiting
NO_SPACE = 144  # retryable: a disk or quota was full; nothing half-written was kept, so a retry (with space) resumes
STORE_UNAVAILABLE = 145  # retryable: the object store kept failing (5xx, throttling, resets) through the retries
