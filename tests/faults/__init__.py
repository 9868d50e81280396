"""Faults (issue 14, R1): each test injects one fault into a real run and asserts that it completes with
no episode lost or recorded twice, or stops with the stated outcome. Real parts where users have them:
vLLM, the trainer's processes, a full file system (tmpfs), Docker."""
