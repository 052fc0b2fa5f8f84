"""The pure core: the causes and what each one means, the state machine of a supervised run,
and the messages (events in, commands out) it speaks. Nothing here starts a thread or a
process, opens a socket or a file, or reads a clock: time arrives inside the events.
"""
