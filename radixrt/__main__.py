"""``python -m radixrt serve ...`` (same as the ``radixrt`` console script)."""
import sys

if __name__ == "__main__":
    from radixrt.runtime.server.launch import main

    sys.exit(main())
