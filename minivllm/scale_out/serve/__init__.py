"""Engine replicas behind one OpenAI endpoint on Ray Serve (``minivllm serve --data-parallel-size N``).

``app.py`` builds the application; ``front.py`` is the HTTP ingress, ``engine_client.py`` its engine over the
replicas, ``replica.py`` one engine replica, ``router.py`` / ``prefix_index.py`` the routing, ``metrics.py``
the merged ``/metrics``. Needs the ray extra (``pip install 'minivllm[ray]'``).
"""
