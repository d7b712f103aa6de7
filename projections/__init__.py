"""What is read: projections fed from the event log. Each one has the same shape: ``apply(batch)``
stores state and position in one transaction, ``checkpoint()`` says how far it got, and
``rebuild()`` runs the same code from position zero into a fresh generation, then switches."""
