"""The fuzz harness: seeded hostile payloads sent to every topic a live run reads (`make fuzz`).

`payloads.py` draws them, `runner.py` sends them to a village run on a real Mosquitto and
checks it: alive to its last tick, every payload refused and counted, the audit the same as
a run that received none of them. tests/test_fuzz.py runs a short schedule in `make test`.
"""
