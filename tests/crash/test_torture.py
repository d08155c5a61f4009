"""kill -9 torture, small scale: publishers with confirms and a consumer with manual acks run
while the broker is SIGKILLed at random moments and restarted on the same data dir, many
times. See torture.py for what is checked; bench/torture.py runs the same at a bigger scale.

WARREN_TORTURE_SEED=N reruns a given kill schedule."""

import os

from .torture import Settings, run


def test_kill9_torture(make_broker, tmp_path):
    from conftest import free_port

    port = free_port()
    data_dir = str(tmp_path)
    seed = os.environ.get("WARREN_TORTURE_SEED")
    settings = Settings(kills=12, min_pause=0.2, max_pause=1.5, size=400, rate=1500,
                        seed=int(seed) if seed else None, settle_timeout=30)

    # A small in-memory window, so the queue also pages to disk and reads its tail back.
    result = run(settings, lambda: make_broker("--queue-window", "300", data_dir=data_dir, port=port))
    print(result.summary())
    assert not result.problems, f"{result.summary()}\n" + "\n".join(result.problems)
    assert result.kills == 12
    assert result.confirmed > 1000, result.summary()
    # The run must have exercised what it checks: deliveries cut off by a kill came back.
    assert result.across_kills > 0, result.summary()
    # Every incarnation logged to the same file (same port): no crash, nothing damaged (a torn
    # tail is possible if a kill lands inside a write, a bad checksum or mark is not).
    log = open(os.path.join(data_dir, f"broker-{port}.log")).read()
    for bad in ("Traceback", "corrupt segment", "bad mark", "missing from the segments"):
        assert bad not in log, f"{result.summary()}: {bad!r} in the broker log"
