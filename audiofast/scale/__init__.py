"""Scale-out past one process: a corpus on a Ray cluster (ray_corpus.py). Live sessions scale
behind HAProxy with the serve replicas' agent-check (audiofast/stream/haproxy_agent.py)."""
