"""The fault harness: random fault schedules (schedule.py), run against real processes (runner.py)."""
