"""The console side of serving: pages, dashboards and their charts, the replay pages, and the
console's client of the nodes' internal API. It reads the database and calls the nodes over
HTTP; it never imports the node runtime (``apps/serving/node/``)."""
