"""Operations: health, metrics, export and import, the loop of background workers."""
