-- One database per verifier node: nodes never share a database (each holds its own witness journal).
CREATE DATABASE potnode1 OWNER pot;
CREATE DATABASE potnode2 OWNER pot;
CREATE DATABASE potnode3 OWNER pot;
