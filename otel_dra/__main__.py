"""Allow ``python -m otel_dra``."""

from otel_dra.cli import main

if __name__ == "__main__":
    main()
