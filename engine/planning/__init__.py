"""How a round's vector is divided: parts, shares by link speed (a linear program), wire
sizes. Pure and torch-free: the backbone plans rounds with it, peers follow the plan."""
