"""Exit codes of the `llmfleet` command, for every subcommand and its help text."""

OK = 0
NOT_FEASIBLE = 1  # `plan`: nothing meets the spec; `estimate`: the configuration cannot run
REQUESTS_FAILED = 1  # `load`: the run finished, but some requests failed or were truncated
OPERATOR_FAILED = 1  # `run`: an internal task of the operator failed; it stopped so as to be restarted
BAD_INPUT = 2  # unreadable file, invalid manifest, unknown name, bad flag; the message names it
TARGET_UNAVAILABLE = 3  # `load`: an endpoint does not answer or does not serve the model
BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a writer killed by it
