"""TRL's trainers as declarations: the entries and the field table of the pinned TRL."""
