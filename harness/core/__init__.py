"""What every layer uses: errors and exit codes, units, the monotonic model clock, asyncio helpers."""
