//! The AppStudio layer against the test tier's API server (the emulator, or the real
//! cluster in GITOPS_TEST_KUBECONFIG): its CRDs, and its controllers run in-process
//! while the test plays the repository generator (writing binding status) and the
//! core (writing GitOpsDeployment status). "kube" in the module's name puts these
//! tests in the real-Kubernetes tier of ops/test.

mod crds;
