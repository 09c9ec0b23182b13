"""What a check found, as `steward doctor`, the health page and the backup schedule's own
row say it: here, so that a row can be made without importing the checks."""

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
