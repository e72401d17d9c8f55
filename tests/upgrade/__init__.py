"""Rolling upgrades between real releases (`make upgrade-check FROM=<rev>`, upgrade_check.py).

The check is not part of `make test`: it needs the old revision in the clone (a CI clone may be
shallow) and runs two releases' daemons for minutes. Its pure parts (the revision check, the
comparison of answers, the report) are unit-tested in test_upgrade_check.py, which is.
"""
