/*
Copyright 2018 The Kubernetes Authors.
Copyright 2022 Google LLC

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    https://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package sidecarmounter

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"cloud.google.com/go/compute/metadata"
	credentials "cloud.google.com/go/iam/credentials/apiv1"
	"github.com/googlecloudplatform/gcs-fuse-csi-driver/pkg/cloud_provider/auth"
	cpmeta "github.com/googlecloudplatform/gcs-fuse-csi-driver/pkg/cloud_provider/metadata"
	"github.com/googlecloudplatform/gcs-fuse-csi-driver/pkg/cloud_provider/storage"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/googlecloudplatform/gcs-fuse-csi-driver/pkg/cloud_provider/clientset"
	"github.com/googlecloudplatform/gcs-fuse-csi-driver/pkg/metrics"
	"github.com/googlecloudplatform/gcs-fuse-csi-driver/pkg/util"
	"github.com/googlecloudplatform/gcs-fuse-csi-driver/pkg/webhook"
	"golang.org/x/oauth2"
	"google.golang.org/api/option"
	"google.golang.org/api/sts/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
)

const metricEndpointFmt = "http://localhost:%v/metrics"

var gracefulKillGracePeriod = 5 * time.Second

// Mounter will be used in the sidecar container to invoke gcsfuse.
type Mounter struct {
	mounterPath           string
	WaitGroup             sync.WaitGroup
	TokenManager          auth.TokenManager
	StorageServiceManager storage.ServiceManager
}

// New returns a Mounter for the current system.
// It provides an option to specify the path to gcsfuse binary.
func New(mounterPath string) *Mounter {
	return &Mounter{
		mounterPath: mounterPath,
	}
}

func (m *Mounter) Mount(ctx context.Context, mc *MountConfig) error {
	mc.EnsureErrWriter()
	// Start the token server for HostNetwork enabled pods.
	// For managed sidecar, the token server identity provider is only populated when host network pod ksa feature is opted in.
	var tokenSource oauth2.TokenSource

	// TODO(amacaskill): Add support for hostnetwork pods on OSS k8s.
	if err := startHostNetworkTokenServer(ctx, mc); err != nil {
		return err
	}

	if mc.HostNetworkKSAOptIn && mc.EnableSidecarBucketAccessCheck {
		// Fetch custom tokensource and audience for host network path. For workload identity, tokenSource is not needed and the audience is hardcoded in TokenSource.FetchIdentityBindingToken().
		audience, err := getAudienceFromContextAndIdentityProvider(ctx, mc.TokenServerIdentityProvider)
		if err != nil {
			return fmt.Errorf("failed to get audience from the context: %w", err)
		}
		tokenSource, err = m.fetchTokenSource(mc.PodNamespace, mc.ServiceAccountName, audience)
		if err != nil {
			return fmt.Errorf("Failed to create token source, got error %q", err)
		}
	}
	if mc.EnableSidecarBucketAccessCheck {
		err := m.checkBucketAccessWithRetry(ctx, tokenSource, mc.BucketName, mc.TokenServerIdentityProvider, mc)
		if err != nil {
			return status.Errorf(codes.Unauthenticated, "failed to prepare storage service or check bucket access, failed with error: %v", err)
		}
	}

	// Clear the GCS Fuse error file after the sidecar bucket access check completes and just before the GCS Fuse mount starts.
	// This ensures the NodePublish volume will always fail if the error persists until the GCS Fuse mount actually starts.
	if err := mc.ErrWriter.Clean(); err != nil {
		klog.Warningf("failed to cleanup error file: %v", err)
	}

	klog.Infof("start to mount bucket %q for volume %q", mc.BucketName, mc.VolumeName)

	if err := createBufferTempDir(mc); err != nil {
		return err
	}

	// gcsfuse supports the `/dev/fd/N` syntax
	// the /dev/fuse is passed as ExtraFiles below, and will always be FD 3
	cmd := m.prepareMountCommand(ctx, mc, "/dev/fd/3")
	cmd.ExtraFiles = []*os.File{os.NewFile(uintptr(mc.FileDescriptor), "/dev/fuse")}

	// when the ctx.Done() is closed,
	// the main workload containers have exited,
	// so it is safe to force kill the gcsfuse process.
	go func(cmd *exec.Cmd) {
		<-ctx.Done()
		klog.V(4).Infof("context marked as done, sleep for 5 seconds, to evaluate gcsfuse process %d exit state", cmd.Process.Pid)
		time.Sleep(time.Second * 5)
		if cmd.ProcessState == nil || !cmd.ProcessState.Exited() {
			klog.Warningf("after 5 seconds, process with id %v has not exited, force kill the process", cmd.Process.Pid)
			if err := cmd.Process.Kill(); err != nil {
				klog.Warningf("failed to force kill process with id %v", cmd.Process.Pid)
			}
		}
	}(cmd)

	m.WaitGroup.Add(1)
	go func() {
		defer m.WaitGroup.Done()
		if err := cmd.Start(); err != nil {
			mc.ErrWriter.WriteMsg(fmt.Sprintf("failed to start gcsfuse with error: %v\n", err))

			return
		}

		klog.Infof("gcsfuse for bucket %q, volume %q started with process id %v", mc.BucketName, mc.VolumeName, cmd.Process.Pid)

		startVolumeMonitoring(ctx, mc, cmd.Process.Pid)

		// Since the gcsfuse has taken over the file descriptor,
		// closing the file descriptor to avoid other process forking it.
		syscall.Close(mc.FileDescriptor)
		waitForGcsfuseExit(cmd, mc)
	}()

	return nil
}

// startHostNetworkTokenServer starts the local token server if hostNetwork KSA feature is opted in.
func startHostNetworkTokenServer(ctx context.Context, mc *MountConfig) error {
	if mc == nil {
		return fmt.Errorf("mount config cannot be nil")
	}
	if !mc.HostNetworkKSAOptIn {
		return nil
	}

	if mc.TokenServerIdentityProvider == "" {
		return fmt.Errorf("HostNetwork Pod KSA feature is opted in, but token server identity provider is not set. Please set identityProvider in VolumeAttributes")
	}

	klog.V(4).Infof("Pod has hostNetwork enabled and token server feature is supported and opted in. Starting Token Server on %s/%s", mc.TempDir, TokenFileName)
	go StartTokenServer(ctx, mc.TempDir, TokenFileName, mc.TokenServerIdentityProvider)

	return nil
}

// MountToNode uses the mount config to initialize the GCSFuse process for a share node mount architecture.
// mountServerContext is the long running context from the sidecar, using this prevents the gcsfuse process from being killed when the NodeStageVolume context (the ctx variable) is canceled.
func (m *Mounter) MountToNode(ctx context.Context, mountServerContext context.Context, mc *MountConfig) error {
	if mc == nil {
		return status.Error(codes.Internal, "mount config cannot be nil")
	}
	if mc.SharedMountPoint == "" {
		return status.Error(codes.Internal, "shared mount point cannot be empty")
	}
	mc.EnsureErrWriter()

	// Start the token server for HostNetwork enabled mounter pods.
	if err := startHostNetworkTokenServer(mountServerContext, mc); err != nil {
		return status.Errorf(codes.Internal, "failed to start host network token server: %v", err)
	}

	klog.Infof("Start mounting GCS bucket %q", mc.BucketName)

	if err := createBufferTempDir(mc); err != nil {
		return status.Errorf(codes.Internal, "failed to create buffer temp dir: %v", err)
	}

	// processCtx is derived from the long-running sidecar container context
	// (mountServerContext) to tie the gcsfuse daemon lifecycle to the pod container
	// rather than the short-lived Mount gRPC call. If MountToNode fails (!success),
	// processCancel is called to shut down the gcsfuse process.
	processCtx, processCancel := context.WithCancel(mountServerContext)
	var success bool
	defer func() {
		if !success {
			processCancel()
		}
	}()

	cmd := m.prepareMountCommand(processCtx, mc, mc.SharedMountPoint)

	klog.Infof("GCSFuse CSI Driver starting gcsfuse in node mounter...")
	if err := cmd.Start(); err != nil {
		return status.Errorf(codes.Internal, "failed to start gcsfuse with error: %v", err)
	}

	klog.Infof("gcsfuse for bucket %q, volume %q started with process id %v", mc.BucketName, mc.VolumeName, cmd.Process.Pid)

	// cmdDone is closed when waitForGcsfuseExit returns, signaling to forceKillCmd
	// that the gcsfuse process has exited so it can return immediately without
	// waiting out the grace period or risking PID reuse.
	cmdDone := make(chan struct{})
	// pollCtx is derived from the short-lived Mount gRPC request context (ctx)
	// and bounds the polling loop in util.WaitForPathMounted so polling stops
	// if the gRPC request times out, is canceled, or if gcsfuse exits early.
	pollCtx, pollCancel := context.WithCancel(ctx)
	defer pollCancel()

	m.WaitGroup.Add(1)
	go func() {
		defer m.WaitGroup.Done()
		waitForGcsfuseExit(cmd, mc)
		// Broadcast that gcsfuse has exited so forceKillCmd does not call cmd.Process.Kill()
		// on an already reaped process or a recycled PID.
		close(cmdDone)
		pollCancel()
		processCancel()
	}()

	// Kill the gcsfuse process if the path has not been mounted within a timeout.
	// This allows the next Mount attempt to start a fresh gcsfuse process.
	if err := util.WaitForPathMounted(pollCtx, mc.SharedMountPoint); err != nil {
		klog.Errorf("gcsfuse process did not mount path %q within the context timeout: %v, killing gcsfuse process with id %d", mc.SharedMountPoint, err, cmd.Process.Pid)
		// Terminate the gcsfuse process asynchronously to avoid blocking the gRPC response.
		go func() {
			forceKillCmd(cmd, cmdDone)
		}()
		return err
	}

	startVolumeMonitoring(mountServerContext, mc, cmd.Process.Pid)

	// Make the gcsfuse process depend on the life-cycle of the mounter pod's container context.
	// This allows the gcsfuse process to be kept alive until the container is killed, as
	// opposed to depending on the life-cycle of the Mount gRPC call.
	go func() {
		<-processCtx.Done()
		if mountServerContext.Err() != nil {
			forceKillCmd(cmd, cmdDone)
		}
	}()
	// Successfully mounted the path, so the gcsfuse process is now tied to the long-running sidecar container context.
	success = true
	return nil
}

// forceKillCmd will force kill the process for a cmd
// once cmdDone is closed.
func forceKillCmd(cmd *exec.Cmd, cmdDone <-chan struct{}) {
	if cmd == nil || cmd.Process == nil {
		return
	}

	select {
	case <-cmdDone:
		// gcsfuse exited cleanly or responded to SIGTERM within the grace period.
		// Return immediately without calling cmd.Process.Kill() to prevent PID reuse issues.
		return
	case <-time.After(gracefulKillGracePeriod):
		// Grace period expired and gcsfuse has not exited; force kill the process.
		klog.Warningf("after 5 seconds, process with id %v has not exited, force kill the process", cmd.Process.Pid)

		if err := cmd.Process.Kill(); err != nil {
			klog.Warningf("failed to force kill process with id %v", cmd.Process.Pid)
		}
	}
}

// waitForGcsfuseExit waits for the gcsfuse process to exit and logs the exit state.
func waitForGcsfuseExit(cmd *exec.Cmd, mc *MountConfig) {
	if err := cmd.Wait(); err != nil {
		errMsg := fmt.Sprintf("gcsfuse exited with error: %v\n", err)
		if strings.Contains(errMsg, "signal: terminated") {
			klog.Infof("[%v] gcsfuse was terminated.", mc.VolumeName)
		} else if strings.Contains(errMsg, "signal: killed") {
			klog.Infof("[%v] gcsfuse was killed.", mc.VolumeName)
		} else {
			mc.ErrWriter.WriteMsg(errMsg)
		}
	} else {
		klog.Infof("[%v] gcsfuse exited normally.", mc.VolumeName)
	}
}

// prepareMountCommand prepares the exec.Cmd with optional NUMA node binding using numactl.
func (m *Mounter) prepareMountCommand(ctx context.Context, mc *MountConfig, mountPoint string) *exec.Cmd {
	args := []string{}
	for k, v := range mc.FlagMap {
		arg := k
		if v != "" {
			arg = fmt.Sprintf("%s=%s", k, v)
		}
		args = append(args, fmt.Sprintf("--%s", arg))
	}

	args = append(args, mc.BucketName)
	args = append(args, mountPoint)
	cmdName := m.mounterPath
	if mc.GcsFuseNumaNode >= 0 && numactlAllowed(ctx, mc.GcsFuseNumaNode) {
		// A nonnegative numa node has been calculated by the csi driver by looking at network
		// interface numa information. So we are confident enough to pass it directly to numactl
		// without further checking.
		klog.Infof("binding gcsfuse to numa node %d", mc.GcsFuseNumaNode)
		numactlArgs := []string{
			fmt.Sprintf("--cpunodebind=%d", mc.GcsFuseNumaNode),
			fmt.Sprintf("--membind=%d", mc.GcsFuseNumaNode),
			m.mounterPath,
		}
		args = append(numactlArgs, args...)
		cmdName = "numactl"
	}

	//nolint: gosec
	klog.Infof("gcsfuse mounting with %s %v...", cmdName, args)
	cmd := exec.CommandContext(ctx, cmdName, args...)

	if mc.EnableAutoGoMemLimit {
		//  Set for the sidecar mounter process
		appliedLimit, err := memlimit.SetGoMemLimitWithOpts(
			memlimit.WithRatio(mc.AutoGoMemLimitRatio),
			memlimit.WithProvider(memlimit.FromCgroup),
		)
		if err != nil {
			klog.V(4).Infof("GOMEMLIMIT not set (expected if gke-gcsfuse-sidecar memory limit is unset): %v", err)
		} else if appliedLimit > 0 {
			// Export GOMEMLIMIT for the gcsfuse child process.
			// If appliedLimit is 0, it means GOMEMLIMIT was already set in
			// the environment or there is no memory limit; in both cases we
			// should not override.
			cmd.Env = append(os.Environ(), fmt.Sprintf("GOMEMLIMIT=%d", appliedLimit))
			klog.Infof("Successfully set GOMEMLIMIT=%d for gcsfuse and sidecar_mounter", appliedLimit)
		}
	}

	cmd.Stdout = os.Stdout
	cmd.Stderr = io.MultiWriter(os.Stderr, mc.ErrWriter)
	cmd.Cancel = func() error {
		klog.V(4).Infof("sending SIGTERM to gcsfuse process: %v", cmd)
		return cmd.Process.Signal(syscall.SIGTERM)
	}

	return cmd
}

func (m *Mounter) fetchTokenSource(saNamespace, saName string, audience string) (oauth2.TokenSource, error) {
	k8stoken, err := util.FetchK8sTokenFromFile(webhook.SidecarContainerSATokenVolumeMountPath + "/" + webhook.K8STokenPath)
	if err != nil {
		return nil, fmt.Errorf("failed to get k8s token from path %v", err)
	}
	return m.TokenManager.GetTokenSourceFromK8sServiceAccount(saNamespace, saName, k8stoken, audience, true), nil
}

func numactlAllowed(ctx context.Context, node int) bool {
	cmd := exec.CommandContext(ctx, "numactl", fmt.Sprintf("--cpunodebind=%d", node), fmt.Sprintf("--membind=%d", node), "true")
	err := cmd.Run()
	if err != nil {
		klog.Warningf("numactl is not allowed: %v", err)
		return false
	}
	klog.Infof("numactl checks out")
	return true
}

// createBufferTempDir creates the buffer temporary directory for the volume mount.
func createBufferTempDir(mc *MountConfig) error {
	bufferTmpDir := filepath.Join(mc.BufferDir, TempDir)
	if err := os.MkdirAll(bufferTmpDir, os.ModePerm); err != nil {
		return fmt.Errorf("failed to create temp dir %q: %w", bufferTmpDir, err)
	}

	return nil
}

// startVolumeMonitoring starts background goroutines for memory usage logging, volume usage logging,
// and Prometheus metrics collection if configured.
func startVolumeMonitoring(ctx context.Context, mc *MountConfig, pid int) {
	loggingSeverity := mc.ConfigFileFlagMap["logging:severity"]
	if loggingSeverity == "debug" || loggingSeverity == "trace" {
		go logMemoryUsage(ctx, pid)
		go logVolumeUsage(ctx, mc.BufferDir, mc.CacheDir)
	}

	promPort, ok := mc.FlagMap["prometheus-port"]
	if ok && promPort != "0" {
		klog.Infof("start to collect metrics from port %v for volume %q", promPort, mc.VolumeName)
		go collectMetrics(ctx, promPort, mc.TempDir)
	}
}

// logMemoryUsage logs gcsfuse process VmRSS (Resident Set Size) usage every 30 seconds.
func logMemoryUsage(ctx context.Context, pid int) {
	ticker := time.NewTicker(30 * time.Second)
	filepath := fmt.Sprintf("/proc/%d/status", pid)
	file, err := os.Open(filepath)
	if err != nil {
		klog.Errorf("failed to open %v: %v", filepath, err)

		return
	}
	defer file.Close()

	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			_, err := file.Seek(0, io.SeekStart)
			if err != nil {
				klog.Errorf("failed to seek to the file beginning: %v", err)

				return
			}

			scanner := bufio.NewScanner(file)
			for scanner.Scan() {
				line := scanner.Text()
				if strings.HasPrefix(line, "VmRSS:") {
					fields := strings.Fields(line)
					klog.Infof("gcsfuse with PID %v uses VmRSS: %v %v", pid, fields[1], fields[2])

					break
				}
			}
		}
	}
}

// logVolumeUsage logs gcsfuse process buffer and cache volume usage every 30 seconds.
func logVolumeUsage(ctx context.Context, bufferDir, cacheDir string) {
	ticker := time.NewTicker(30 * time.Second)

	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			// TODO: this method does not work for the buffer dir
			logVolumeTotalSize(bufferDir)
			logVolumeTotalSize(cacheDir)
		}
	}
}

// logVolumeTotalSize logs the total volume size of dirPath.
// Warning: this func uses filepath.Walk func that is less efficient when dealing with very large directory trees.
func logVolumeTotalSize(dirPath string) {
	var totalSize int64

	err := filepath.Walk(dirPath, func(_ string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if !info.IsDir() {
			totalSize += info.Size()
		}

		return nil
	})

	if err != nil {
		klog.Errorf("failed to calculate volume total size for %q: %v", dirPath, err)
	} else {
		klog.Infof("total volume size of %v: %v bytes", dirPath, totalSize)
	}
}

// collectMetrics collects metrics from the gcsfuse instance.
// Meanwhile, a server is created for each gcsfuse instance,
// exposing a unix domain socket for CSI driver to connect.
func collectMetrics(ctx context.Context, port, tempDir string) {
	metricEndpoint := fmt.Sprintf(metricEndpointFmt, port)

	// Create a unix domain socket and listen for incoming connections.
	socketPath := filepath.Join(tempDir, metrics.SocketName)

	// Cleanup any stale metrics path to handle container restart scenario.
	err := util.CheckAndDeleteStaleFile(tempDir, metrics.SocketName)
	if err != nil {
		klog.Errorf("failed to check and delete stale metrics socket file: %v", err)

		return
	}

	klog.V(4).Infof("Start listen on metrics collector socket %s", socketPath)
	socket, err := net.Listen("unix", socketPath)
	if err != nil {
		klog.Errorf("failed to create socket %q: %v", socketPath, err)

		return
	}

	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		timeoutCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()

		if err := scrapeMetrics(timeoutCtx, metricEndpoint, w); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})

	server := http.Server{
		Handler:      mux,
		ReadTimeout:  10 * time.Second,
		WriteTimeout: 10 * time.Second,
	}
	if err := server.Serve(socket); err != nil {
		klog.Errorf("failed to start the metrics server for %q: %v", socketPath, err)
	}
}

// scrapeMetrics connects to the metrics endpoint and scrapes latest metrics sample.
// The response is written to a new http.ResponseWriter.
func scrapeMetrics(ctx context.Context, metricEndpoint string, w http.ResponseWriter) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, metricEndpoint, nil)
	if err != nil {
		return fmt.Errorf("failed to create HTTP request to %q: %w", metricEndpoint, err)
	}

	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("failed to make HTTP request to %q: %w", metricEndpoint, err)
	}
	defer resp.Body.Close()

	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("unexpected HTTP status: %v", resp.Status)
	}

	if _, err := io.Copy(w, resp.Body); err != nil {
		return fmt.Errorf("failed to copy response: %w", err)
	}

	return nil
}

func StartTokenServer(ctx context.Context, tokenURLBasePath, tokenSocketName string, identityProvider string) {
	// Clean up any stale socket file before creating a new one.
	err := util.CheckAndDeleteStaleFile(tokenURLBasePath, tokenSocketName)
	if err != nil {
		klog.Errorf("failed to check and delete stale token server socket file: %v", err)

		return
	}

	// Create a unix domain socket and listen for incoming connections.
	tokenURLSocketPath := filepath.Join(tokenURLBasePath, tokenSocketName)
	tokenSocketListener, err := net.Listen("unix", tokenURLSocketPath)
	if err != nil {
		klog.Errorf("failed to create socket %q: %v", tokenURLSocketPath, err)

		return
	}
	klog.Infof("created a listener using the socket path %s", tokenURLSocketPath)
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()

		k8stoken, err := util.FetchK8sTokenFromFile(webhook.SidecarContainerSATokenVolumeMountPath + "/" + webhook.K8STokenPath)
		var stsToken *oauth2.Token
		if err != nil {
			klog.Errorf("failed to get k8s token from path %v", err)
			w.WriteHeader(http.StatusInternalServerError)

			return
		}

		stsToken, err = fetchIdentityBindingToken(ctx, k8stoken, identityProvider)
		if err != nil {
			klog.Errorf("failed to get sts token from path %v", err)
			w.WriteHeader(http.StatusInternalServerError)

			return
		}

		// Marshal the oauth2.Token object to JSON
		jsonToken, err := json.Marshal(stsToken)
		if err != nil {
			klog.Errorf("failed to marshal token to JSON: %v", err)
			w.WriteHeader(http.StatusInternalServerError)

			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		fmt.Fprint(w, string(jsonToken))
	})

	server := http.Server{
		Handler:      mux,
		ReadTimeout:  10 * time.Second,
		WriteTimeout: 10 * time.Second,
	}

	if err := server.Serve(tokenSocketListener); !errors.Is(err, http.ErrServerClosed) {
		klog.Errorf("Server for %q returns unexpected error: %v", tokenURLSocketPath, err)
	}
}

func (m *Mounter) executeFuncWithRetry(ctx context.Context, mc *MountConfig, f func(ctx context.Context) (bool, error)) error {
	backoff := wait.Backoff{
		Duration: mc.SidecarRetryConfig.Duration,
		Factor:   mc.SidecarRetryConfig.Factor,
		Cap:      mc.SidecarRetryConfig.Cap,
		Steps:    mc.SidecarRetryConfig.Steps,
		Jitter:   mc.SidecarRetryConfig.Jitter, // Adds randomness, this will give +/- 10% of the current delay
	}
	err := wait.ExponentialBackoffWithContext(ctx, backoff, f)
	if err != nil {
		return fmt.Errorf("operation failed after retries: %w", err)
	}
	return nil
}

// checkBucketAccessWithRetry prepares the GCS Storage Service using the Kubernetes Service Account from VolumeContext and validates bucket access.
func (m *Mounter) checkBucketAccessWithRetry(ctx context.Context, tokenSource oauth2.TokenSource, bucketName string, tokenProvider string, mc *MountConfig) error {
	var err error
	var ss storage.Service
	ssCreateAndBucketCheckFunc := func(ctx context.Context) (bool, error) {
		if ss == nil {
			ss, err = m.StorageServiceManager.SetupStorageServiceForSidecar(ctx, tokenSource, mc.StorageEndpoint)
			if err != nil {
				mc.ErrWriter.WriteMsg(retryableError(fmt.Sprintf("%q: %v %v, retrying...", util.StorageServiceErrorStr, storage.ParseErrCode(err), err)))
				return false, nil
			}
			klog.V(4).Infof("Created storage service %v", ss)
		}

		if bucketName != "_" {
			if exist, err := ss.CheckBucketExists(ctx, &storage.ServiceBucket{Name: bucketName}); !exist {
				mc.ErrWriter.WriteMsg(retryableError(fmt.Sprintf("failed to get GCS bucket %q: %v %v", bucketName, storage.ParseErrCode(err), err)))
				return false, nil
			}
			klog.V(4).Infof("Bucket access check passed for %s", bucketName)
			return true, nil

		} else {
			// Access check fro multi-bucket is not supported, this is in-line with current bucket access check logic in CSI node driver
			klog.V(4).Infof("Skipping bucket check, access check will not be performed on multi-buckets with bucket name %s", bucketName)
			return true, nil
		}
	}

	if err := m.executeFuncWithRetry(ctx, mc, ssCreateAndBucketCheckFunc); err != nil {
		return err
	}
	return nil
}

// getAudienceFromContextAndIdentityProvider uses the given identityProvider and returns a formatted audience string used for STS Token exchange.
// For a GKE cluster, the audience is formatted like "identitynamespace:PROJECT_ID.svc.id.goog:IDENTITY_PROVIDER". For a non-GKE cluster,
// the audience is simply the identityProvider.
func getAudienceFromContextAndIdentityProvider(ctx context.Context, identityProvider string) (string, error) {
	projectID, err := metadata.ProjectIDWithContext(ctx)
	if err != nil {
		return "", fmt.Errorf("failed to get project ID: %w", err)
	}

	if util.IsGKEIdentityProvider(identityProvider) {
		return fmt.Sprintf(
			"identitynamespace:%s.svc.id.goog:%s",
			projectID,
			identityProvider,
		), nil
	}

	return identityProvider, nil
}

func (m *Mounter) SetupTokenAndStorageManager(ctx context.Context, clientset clientset.Interface, mc *MountConfig) error {
	mc.EnsureErrWriter()

	if mc.TokenServerIdentityPool != "" && mc.TokenServerIdentityProvider != "" {
		var tm auth.TokenManager
		var ssm storage.ServiceManager
		setupTokenAndStorageManagerFunc := func(ctx context.Context) (bool, error) {
			meta, err := cpmeta.NewMetadataService(mc.TokenServerIdentityPool, mc.TokenServerIdentityProvider)
			if err != nil {
				mc.ErrWriter.WriteMsg(retryableError(fmt.Sprintf("failed to setup metadata service, got error: %v for identity pool %q and identity provider %q, retrying....", err, mc.TokenServerIdentityPool, mc.TokenServerIdentityProvider)))
				return false, nil
			}

			tm = auth.NewTokenManager(meta, clientset)
			ssm, err = storage.NewGCSServiceManager()
			if err != nil {
				mc.ErrWriter.WriteMsg(retryableError(fmt.Sprintf("failed to setup storage service manager, got error: %v for identity pool %q and identity provider %q, retrying...", err, mc.TokenServerIdentityPool, mc.TokenServerIdentityProvider)))
				return false, nil
			}
			m.TokenManager = tm
			m.StorageServiceManager = ssm
			return true, nil
		}
		if err := m.executeFuncWithRetry(ctx, mc, setupTokenAndStorageManagerFunc); err != nil {
			return err
		}
		klog.V(4).Infof("Setup complete for token manager and storage service manager %v and %v", m.TokenManager, m.StorageServiceManager)
		return nil
	}
	return errors.New(retryableError(fmt.Sprintf("both identity pool and identity provider must be provided, got: %q and %q respectively", mc.TokenServerIdentityPool, mc.TokenServerIdentityProvider)))
}

func fetchIdentityBindingToken(ctx context.Context, k8sSAToken string, identityProvider string) (*oauth2.Token, error) {
	stsService, err := sts.NewService(ctx, option.WithHTTPClient(&http.Client{}))
	if err != nil {
		return nil, fmt.Errorf("new STS service error: %w", err)
	}

	audience, err := getAudienceFromContextAndIdentityProvider(ctx, identityProvider)
	if err != nil {
		return nil, fmt.Errorf("failed to get audience from the context: %w", err)
	}

	stsRequest := &sts.GoogleIdentityStsV1ExchangeTokenRequest{
		Audience:           audience,
		GrantType:          "urn:ietf:params:oauth:grant-type:token-exchange",
		Scope:              credentials.DefaultAuthScopes()[0],
		RequestedTokenType: "urn:ietf:params:oauth:token-type:access_token",
		SubjectTokenType:   "urn:ietf:params:oauth:token-type:jwt",
		SubjectToken:       k8sSAToken,
	}

	stsResponse, err := stsService.V1.Token(stsRequest).Do()
	if err != nil {
		return nil, fmt.Errorf("IdentityBindingToken exchange error with audience %q: %w", audience, err)
	}

	return &oauth2.Token{
		AccessToken: stsResponse.AccessToken,
		TokenType:   stsResponse.TokenType,
		Expiry:      time.Now().Add(time.Second * time.Duration(stsResponse.ExpiresIn)),
	}, nil
}

func retryableError(inputErr string) string {
	return fmt.Sprintf("%s: %v", util.SidecarBucketAccessCheckErrorPrefix, inputErr)
}
