"""The package's version: the one place it is written. The build backend
(backend/gorovod_build.py) reads it from here for the wheel's name and
metadata; gorovod.__version__ is this."""

__version__ = "0.1.0"
