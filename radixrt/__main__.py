"""``python -m radixrt serve ...`` (same as the ``radixrt`` console script)."""

if __name__ == "__main__":
    from radixrt.runtime.server.launch import cli

    cli()
