"""The confirmation stage of ``autotune.objective=time_to_target``: the study's best
configurations and the user's command on paired seeds, the decision, and the pick timed
against the command."""
