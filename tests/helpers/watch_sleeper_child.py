"""A child that sleeps in a named function (for the py-spy stack dump test)."""
import time


def waiting_for_godot() -> None:
    print("ready", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    waiting_for_godot()
