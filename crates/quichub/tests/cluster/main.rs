//! End-to-end tests of clusters: static origins, members in a real etcd
//! (plain and with TLS and auth). The test that captures the process's logs
//! (`e2e_cluster_secrets`) is a binary of its own: its global log subscriber
//! would see these tests' logs too.

mod e2e_cluster;
mod e2e_etcd;
mod e2e_etcd_secure;
