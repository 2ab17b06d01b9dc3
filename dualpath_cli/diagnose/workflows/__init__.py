"""The troubleshooting workflows, one module each (as tui/screens/ is one module per screen).

diagnose/rules.py names and runs them; diagnose/grading.py and diagnose/thresholds.py hold
what they share.
"""
