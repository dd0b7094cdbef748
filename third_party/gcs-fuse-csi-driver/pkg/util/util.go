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

package util

import (
	"context"
	"crypto/sha1"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	compute "google.golang.org/api/compute/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	mount "k8s.io/mount-utils"
)

const (
	KiB = 1024
	MiB = 1024 * KiB

	TrueStr  = "true"
	FalseStr = "false"

	// mount options that both CSI mounter and sidecar mounter should understand.
	DisableMetricsForGKE                = "disable-metrics-for-gke"
	EnableSidecarBucketAccessCheckConst = "enable-sidecar-bucket-access-check"
	TokenServerIdentityPoolConst        = "token-server-identity-pool"
	ServiceAccountNameConst             = "service-account-name"
	PodNamespaceConst                   = "pod-namespace"
	PodNameConst                        = "pod-name"
	PodUIDConst                         = "pod-uid"
	TokenServerIdentityProviderConst    = "token-server-identity-provider"
	FileCacheMediumConst                = "file-cache-medium"
	EnableGCSFuseKernelParams           = "enable-gcsfuse-kernel-params"
	GCSFuseKernelParamsFileName         = "kernel-params.json"
	ErrorFileName                       = "error"
	MediumRAM                           = "ram"
	MediumLSSD                          = "lssd"
	OptInHnw                            = "hnw-ksa"
	EnableCloudProfilerForSidecarConst  = "enable-cloud-profiler-for-sidecar"
	EnableCloudProfilerConst            = "enable-cloud-profiler"
	SidecarContainerTmpVolumeName       = "gke-gcsfuse-tmp"
	SidecarBucketAccessCheckErrorPrefix = "sidecar bucket access check error"
	StorageServiceErrorStr              = "failed to setup storage service"
	GCSFuseCsiDriverName                = "gcsfuse.csi.storage.gke.io"
	GCSFuseNumaNodeArg                  = "gcs-fuse-numa-node"
	GCSFuseAppNameArg                   = "app-name"
	CustomEndpointConfigFileFlag        = "gcs-connection:custom-endpoint"
	CustomEndpointCLIFlag               = "custom-endpoint"
	EnableAutoGoMemLimitConst           = "enable-auto-gomemlimit"
	AutoGoMemLimitRatioConst            = "auto-gomemlimit-ratio"
	GoMemLimitCgroupPercentage          = 0.95
	StorageEndpointInternal             = "storage-endpoint-internal"
	KubeletDir                          = "/var/lib/kubelet"
	KubeletPluginsGCSFuseDir            = "/var/lib/kubelet/plugins/kubernetes.io/csi/gcsfuse.csi.storage.gke.io"
	VolumeContextKeyPVName              = "csi.storage.k8s.io/pv/name"
	MounterPodNamePrefix                = "gcsfusecsi-mount"
	SidecarImageConfigMapName           = "gcsfusecsi-image-config"
	SidecarImageConfigMapKey            = "sidecar-image"
	// Note: All variables here are in KiB instead of KB but they are added like this to ensure consistency in codebase.

	readAheadKBMountFlagRegexPattern = "^read_ahead_kb=(.+)$"
	readAheadKBMountFlag             = "read_ahead_kb"
	// Hidden CSI flag never to be passed to gcsfuse
	nodeFuseMaxRequestLimitKBMountFlag             = "node_fuse_max_request_limit_kb"
	nodeFuseMaxRequestLimitKBMountFlagRegexPattern = "^" + nodeFuseMaxRequestLimitKBMountFlag + "=(.+)$"
	// Hidden CSI flag never to be passed to gcsfuse
	defaultNodeFuseMaxRequestLimitKB = 16 * MiB / KiB // 16 MiB Request Size
	// minPageSizeKB defines the minimum page size (4 KiB) to use as a fallback.
	minPageSizeKB = 4
	// maxFuseMaxPagesLimit defines the maximum pages limit supported by the Linux FUSE kernel (2^16 - 1).
	maxFuseMaxPagesLimit = 65535
)

var (
	volumeIDRegEx            = regexp.MustCompile(`:.*$`)
	targetPathRegexp         = regexp.MustCompile(`/var/lib/kubelet/pods/(.*)/volumes/kubernetes\.io~csi/(.*)/mount`)
	emptyReplacementRegexp   = regexp.MustCompile(`kubernetes\.io~csi/(.*)/mount`)
	gkeIdentityProviderRegex = regexp.MustCompile(
		`^https://(?:[a-z0-9-]+-)?container(?:\.sandbox)?\.googleapis\.com/v1/projects/[^/]+/locations/[^/]+/clusters/[^/]+$`,
	)
	procMountsPath = "/proc/mounts"
	allowedOptions = map[string]bool{
		"exec":    true,
		"noexec":  true,
		"atime":   true,
		"noatime": true,
		"sync":    true,
		"async":   true,
		"dirsync": true,
	}

	readAheadKBMountFlagRegex               = regexp.MustCompile(readAheadKBMountFlagRegexPattern)
	nodeFuseMaxRequestLimitKBMountFlagRegex = regexp.MustCompile(nodeFuseMaxRequestLimitKBMountFlagRegexPattern)
)

// ConvertLabelsStringToMap converts the labels from string to map
// example: "key1=value1,key2=value2" gets converted into {"key1": "value1", "key2": "value2"}
func ConvertLabelsStringToMap(labels string) (map[string]string, error) {
	const labelsDelimiter = ","
	const labelsKeyValueDelimiter = "="

	labelsMap := make(map[string]string)
	if labels == "" {
		return labelsMap, nil
	}

	// Following rules enforced for label keys
	// 1. Keys have a minimum length of 1 character and a maximum length of 63 characters, and cannot be empty.
	// 2. Keys and values can contain only lowercase letters, numeric characters, underscores, and dashes.
	// 3. Keys must start with a lowercase letter.
	regexKey := regexp.MustCompile(`^\p{Ll}[\p{Ll}0-9_-]{0,62}$`)
	checkLabelKeyFn := func(key string) error {
		if !regexKey.MatchString(key) {
			return fmt.Errorf("label value %q is invalid (should start with lowercase letter / lowercase letter, digit, _ and - chars are allowed / 1-63 characters", key)
		}

		return nil
	}

	// Values can be empty, and have a maximum length of 63 characters.
	regexValue := regexp.MustCompile(`^[\p{Ll}0-9_-]{0,63}$`)
	checkLabelValueFn := func(value string) error {
		if !regexValue.MatchString(value) {
			return fmt.Errorf("label value %q is invalid (lowercase letter, digit, _ and - chars are allowed / 0-63 characters", value)
		}

		return nil
	}

	keyValueStrings := strings.Split(labels, labelsDelimiter)
	for _, keyValue := range keyValueStrings {
		keyValue := strings.Split(keyValue, labelsKeyValueDelimiter)

		if len(keyValue) != 2 {
			return nil, fmt.Errorf("labels %q are invalid, correct format: 'key1=value1,key2=value2'", labels)
		}

		key := strings.TrimSpace(keyValue[0])
		if err := checkLabelKeyFn(key); err != nil {
			return nil, err
		}

		value := strings.TrimSpace(keyValue[1])
		if err := checkLabelValueFn(value); err != nil {
			return nil, err
		}

		labelsMap[key] = value
	}

	const maxNumberOfLabels = 64
	if len(labelsMap) > maxNumberOfLabels {
		return nil, fmt.Errorf("more than %d labels is not allowed, given: %d", maxNumberOfLabels, len(labelsMap))
	}

	return labelsMap, nil
}

func ParseEndpoint(endpoint string, cleanupSocket bool) (string, string, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		klog.Fatal(err.Error())
	}

	var addr string
	switch u.Scheme {
	case "unix":
		addr = u.Path
		if cleanupSocket {
			if err := os.Remove(addr); err != nil && !os.IsNotExist(err) {
				klog.Fatalf("Failed to remove %s, error: %s", addr, err)
			}
		}
	case "tcp":
		addr = u.Host
	default:
		klog.Fatalf("%v endpoint scheme not supported", u.Scheme)
	}

	return u.Scheme, addr, nil
}

func ParsePodIDVolumeFromTargetpath(targetPath string) (string, string, error) {
	matched := targetPathRegexp.FindStringSubmatch(targetPath)
	if len(matched) < 3 {
		return "", "", fmt.Errorf("targetPath %v does not contain Pod ID or volume information", targetPath)
	}
	podID := matched[1]
	volume := matched[2]

	return podID, volume, nil
}

func PrepareEmptyDir(targetPath string, createEmptyDir bool) (string, error) {
	_, _, err := ParsePodIDVolumeFromTargetpath(targetPath)
	if err != nil {
		return "", fmt.Errorf("failed to parse volume name from target path %q: %w", targetPath, err)
	}

	emptyDirBasePath := emptyReplacementRegexp.ReplaceAllString(targetPath, fmt.Sprintf("kubernetes.io~empty-dir/%v/.volumes/$1", SidecarContainerTmpVolumeName))

	if createEmptyDir {
		if err := os.MkdirAll(emptyDirBasePath, 0o750); err != nil {
			return "", fmt.Errorf("mkdir failed for path %q: %w", emptyDirBasePath, err)
		}
	}

	return emptyDirBasePath, nil
}

// sha1Hash function takes a string as input and returns its SHA1 hash as a hexadecimal string.
func sha1Hash(str string) string {
	return fmt.Sprintf("%x", sha1.Sum([]byte(str)))
}

// GetSocketBasePath constructs the base path for a Unix domain socket.
// It takes the podUID, volumeName, and the directory where Fuse sockets are stored as input.
func GetSocketBasePath(podUID, volumeName, fuseSocketDir string) string {
	// We hash the combined pod ID and volume name because Unix domain socket paths
	// have a length limitation (often around 104 characters). Directly using potentially
	// long pod IDs and volume names could easily violate this limit. SHA1 provides a
	// fixed-length, short representation (40 hexadecimal characters) that ensures
	// we stay within these constraints while still providing a unique identifier
	// based on the pod and volume.
	return filepath.Join(fuseSocketDir, sha1Hash(podUID+"_"+volumeName))
}

func CheckAndDeleteStaleFile(dirPath, fileName string) error {
	filePath := filepath.Join(dirPath, fileName)

	// Use os.Stat to check for file existence.
	if _, err := os.Stat(filePath); err != nil {
		if os.IsNotExist(err) {
			// File does not exist.
			klog.V(4).Infof("File '%s' not found in '%s'. No action needed.", fileName, dirPath)

			return nil
		}
		// Other error occurred (e.g., permissions issue, directory not found)
		return fmt.Errorf("error checking for stale file '%s' in '%s': %w", fileName, dirPath, err)
	}

	// Stale file exists.
	klog.V(4).Infof("File '%s' found in '%s'. Attempting to delete...", fileName, dirPath)

	// Delete the file.
	if deleteErr := os.Remove(filePath); deleteErr != nil {
		return fmt.Errorf("failed to delete file '%s': %w", filePath, deleteErr)
	}
	klog.Infof("Stale file '%s' successfully deleted", fileName)

	return nil
}

func FetchK8sTokenFromFile(tokenPath string) (string, error) {
	token, err := os.ReadFile(tokenPath)
	if err != nil {
		return "", fmt.Errorf("error reading token file: %w", err)
	}

	return strings.TrimSpace(string(token)), nil
}

// The format allows customers to specify a fake volume handle for static provisioning,
// enabling multiple PVs in the same pod to mount the same bucket. This prevents Kubelet from
// skipping mounts of volumes with the same volume handle, which can cause the pod to be stuck in container creation.
func ParseVolumeID(bucketHandle string) string {
	return volumeIDRegEx.ReplaceAllString(bucketHandle, "")
}

func GetZonesForALocation(ctx context.Context, projectNumber string, computeService *compute.Service, location string) ([]string, error) {
	klog.Info("Getting zones for location: ", location, " in project: ", projectNumber)

	// Validating inputs.
	if projectNumber == "" {
		return []string{}, status.Errorf(codes.Internal, "no project number provided")
	}
	if computeService == nil {
		return []string{}, status.Errorf(codes.Internal, "compute service can't be nil")
	}

	// Handle the zonal cluster case.
	_, err := computeService.Zones.Get(projectNumber, location).Context(ctx).Do()
	if err == nil {
		return []string{location}, nil
	}
	errs := []error{err}

	// Handle the regional cluster case.
	regionObj, err := computeService.Regions.Get(projectNumber, location).Context(ctx).Do()
	if err == nil {
		var zones []string
		for _, zoneURL := range regionObj.Zones {
			zoneName := path.Base(zoneURL)
			zones = append(zones, zoneName)
		}
		return zones, nil
	}
	errs = append(errs, err)

	// region and zonal API errors are both non-nil. The API request failed either because it's not a zone nor a region or some internal error.
	return []string{}, fmt.Errorf("failed to get location %s: %v", location, errors.Join(errs...))
}

// Returns true if the identity provider is a GKE identity provider in the format:
// https://container.googleapis.com/v1/projects/{project_id}/locations/{location}/clusters/{cluster_name}.
// Other GKE environments (staging, staging2, test, sandbox) are supported as well.
func IsGKEIdentityProvider(identityProvider string) bool {
	return gkeIdentityProviderRegex.MatchString(identityProvider)
}

func ParseBool(str string) (bool, error) {
	switch str {
	case "True", "true":
		return true, nil
	case "False", "false":
		return false, nil
	default:
		return false, fmt.Errorf("could not parse string to bool: the acceptable values for %q are 'True', 'true', 'false' or 'False'", str)
	}
}

// GetCloudProfilerServiceVersion returns the service version for Cloud Profiler.
// It returns the provided podName and podUID joined by an underscore.
// If both podName and podUID are empty, it returns an empty string.
func GetCloudProfilerServiceVersion(podName, podUID string) string {
	if podName == "" && podUID == "" {
		return ""
	}
	return fmt.Sprintf("%s_%s", podName, podUID)
}

// CheckNotSymlink verifies that the given path is not a symbolic link.
// This is used to prevent TOCTOU symlink takeover attacks.
func CheckNotSymlink(path string) error {
	info, err := os.Lstat(path)
	if err != nil {
		return fmt.Errorf("failed to stat path %q: %w", path, err)
	}
	if info.Mode()&os.ModeSymlink != 0 {
		return fmt.Errorf("security error: path %q is a symlink", path)
	}
	return nil
}

// IsDirMounted checks if the path is already a mount point.
func IsDirMounted(targetPath string) (bool, error) {
	mps, err := mount.ListProcMounts(procMountsPath)
	if err != nil {
		return false, err
	}
	cleanTargetPath := filepath.Clean(targetPath)
	for _, m := range mps {
		if filepath.Clean(m.Path) == cleanTargetPath {
			return true, nil
		}
	}

	return false, nil
}

// WaitForPathMounted waits until the given path is mounted or the context expires.
func WaitForPathMounted(ctx context.Context, path string) error {
	pollInterval := 1 * time.Second
	klog.Infof("Waiting for path %q to be mounted. Polling every %q", path, pollInterval)

	condition := func(ctx context.Context) (bool, error) {
		mounted, err := IsDirMounted(path)
		if err != nil {
			klog.Warningf("failed to check if path %q is already mounted (will retry): %v", path, err)
			return false, nil // Continue polling
		}
		if mounted {
			klog.Infof("path %q was mounted", path)
			return true, nil
		}
		return false, nil
	}

	if err := wait.PollUntilContextCancel(ctx, pollInterval, true, condition); err != nil {
		// wait.PollUntilContextCancel returns context.DeadlineExceeded or context.Canceled on timeout/cancellation.
		code := codes.DeadlineExceeded
		if errors.Is(err, context.Canceled) {
			code = codes.Canceled
		}
		return status.Errorf(code, "timeout waiting for path %q to be mounted: %v", path, err)
	}

	return nil
}

// CeilDiv64 performs integer division of 'a' by 'b', rounding the result up.
func CeilDiv64(a, b int64) int64 {
	return (a + b - 1) / b
}

// PrepareSharedMountOptions prepares mount options specifically for shared node mount architecture.
// It returns gcsfuseMO, sysfsBDI, fuseMaxPagesLimit, and error.
func PrepareSharedMountOptions(options []string) ([]string, map[string]int64, int64, error) {
	defaultCSIMountOptions := []string{"allow_other,default_permissions"}
	linuxMO, sidecarMountOptions, sysfsBDI, fuseMaxPagesLimit, err := prepareMountOptions(options, defaultCSIMountOptions)
	if err != nil {
		return nil, nil, fuseMaxPagesLimit, err
	}
	for i, opt := range linuxMO {
		linuxMO[i] = "o=" + opt
	}
	// For shared node mounts we pass both linux mo and sidecar mo, with linux mo being prefixed with "o=" to be passed to gcsfuse.
	gcsfuseMO := append(linuxMO, sidecarMountOptions...)
	return gcsfuseMO, sysfsBDI, fuseMaxPagesLimit, nil
}

// CheckForKernelReader returns true if kernel reader is enabled in mount options.
func CheckForKernelReader(options []string) bool {
	for _, o := range options {
		if o == "enable-kernel-reader" || o == "enable-kernel-reader=true" || o == "file-system:enable-kernel-reader:true" {
			return true
		}
	}
	return false
}

// PrepareSidecarMountOptions prepares mount options specifically for sidecar mounter.
func PrepareSidecarMountOptions(options []string) ([]string, []string, map[string]int64, int64, error) {
	defaultOptions := []string{
		"nodev",
		"nosuid",
		"allow_other",
		"default_permissions",
		"rootmode=40000",
		fmt.Sprintf("user_id=%d", os.Getuid()),
		fmt.Sprintf("group_id=%d", os.Getgid()),
	}
	return prepareMountOptions(options, defaultOptions)
}

// prepareMountOptions parses and separates raw mount options into CSI/gcsfuse mount options,
// remaining options, sysfs BDI settings (such as read_ahead_kb), and the FUSE max pages limit.
// It relies on the passed csiMountOptions slice to provide initial default mount options.
// And uses allowedOptions map to filter out invalid linux options.
func prepareMountOptions(options []string, csiMountOptions []string) ([]string, []string, map[string]int64, int64, error) {
	// Copy csiMountOptions to avoid modifying the caller's slice or shared globals.
	csiMountOptions = append([]string(nil), csiMountOptions...)

	// users may pass options that should be used by Linux mount(8),
	// filter out these options and not pass to the sidecar mounter.
	validMountOptions := []string{"rw", "ro"}
	optionSet := sets.NewString(options...)
	for _, o := range validMountOptions {
		if optionSet.Has(o) {
			csiMountOptions = append(csiMountOptions, o)
			optionSet.Delete(o)
		}
	}

	sysfsBDI := make(map[string]int64)
	pageSizeKB := max(minPageSizeKB, int64(os.Getpagesize()/KiB))
	// Calculate default FUSE max pages limit. We use integer ceiling division to ensure we round
	// up to the next page if the default size 16MB is not a perfect multiple of the page size on the machine.
	fuseMaxPagesLimit := CeilDiv64(defaultNodeFuseMaxRequestLimitKB, pageSizeKB)

	for _, o := range optionSet.List() {
		if strings.HasPrefix(o, "o=") {
			v := o[2:]
			if allowedOptions[v] {
				csiMountOptions = append(csiMountOptions, v)
			} else {
				klog.Warningf("got invalid mount option %q. Will discard invalid options and continue to mount.", v)
			}
			optionSet.Delete(o)
		}

		if readAheadKB := readAheadKBMountFlagRegex.FindStringSubmatch(o); len(readAheadKB) == 2 {
			// There is only one matching pattern in readAheadKBMountFlagRegex
			// If found, it will be at index 1
			readAheadKBInt, err := strconv.ParseInt(readAheadKB[1], 10, 0)
			if err != nil {
				return nil, nil, nil, 0, fmt.Errorf("invalid read_ahead_kb mount flag %q: %w", o, err)
			}
			if readAheadKBInt < 0 {
				return nil, nil, nil, 0, fmt.Errorf("invalid negative value for read_ahead_kb mount flag: %q", o)
			}
			sysfsBDI[readAheadKBMountFlag] = readAheadKBInt
			optionSet.Delete(o)
		}

		if maxReqSize := nodeFuseMaxRequestLimitKBMountFlagRegex.FindStringSubmatch(o); len(maxReqSize) == 2 {
			nodeFuseMaxRequestLimitKB, err := strconv.ParseInt(maxReqSize[1], 10, 0)
			if err != nil {
				return nil, nil, nil, 0, fmt.Errorf("invalid %s mount flag %q: %w", nodeFuseMaxRequestLimitKBMountFlag, o, err)
			}
			if nodeFuseMaxRequestLimitKB < 0 {
				return nil, nil, nil, 0, fmt.Errorf("invalid negative value for %s mount flag: %q", nodeFuseMaxRequestLimitKBMountFlag, o)
			}
			maxAllowedSizeKB := maxFuseMaxPagesLimit * pageSizeKB
			if nodeFuseMaxRequestLimitKB > maxAllowedSizeKB {
				return nil, nil, nil, 0, fmt.Errorf("invalid value for %s mount flag %q: exceeds maximum allowed limit of %d KiB on this host", nodeFuseMaxRequestLimitKBMountFlag, o, maxAllowedSizeKB)
			}
			// Convert the requested size in KB to pages. We use integer ceiling division
			// to round up to the next page if the requested size is not a multiple of the
			// page size. This ensures we can accommodate the full requested buffer size in
			// a single fuse request.
			fuseMaxPagesLimit = CeilDiv64(nodeFuseMaxRequestLimitKB, pageSizeKB)
			optionSet.Delete(o)
		}
	}

	return csiMountOptions, optionSet.List(), sysfsBDI, fuseMaxPagesLimit, nil
}

// updateSysfsConfig modifies the kernel page cache settings based on the read_ahead_kb provided in the mountOption,
// and verifies that the values are successfully updated after the operation completes.
func updateSysfsConfig(targetMountPath string, sysfsBDI map[string]int64) error {
	// Command will hang until mount completes.
	cmd := exec.Command("mountpoint", "-d", targetMountPath)
	output, err := cmd.CombinedOutput()
	if err != nil {
		klog.Errorf("Error executing mountpoint command on target path %s: %v", targetMountPath, err)
		var exitError *exec.ExitError
		if errors.As(err, &exitError) {
			klog.Errorf("Exit code: %d", exitError.ExitCode())
		}

		return err
	}

	targetDevice := strings.TrimSpace(string(output))
	klog.Infof("Output of mountpoint for target mount path %s: %s", targetMountPath, output)

	for key, value := range sysfsBDI {
		// Update the target value.
		sysfsBDIPath := filepath.Join("/sys/class/bdi/", targetDevice, key)
		file, err := os.OpenFile(sysfsBDIPath, os.O_WRONLY|os.O_TRUNC, 0o644)
		if err != nil {
			return fmt.Errorf("failed to open file %q: %w", sysfsBDIPath, err)
		}
		defer file.Close()

		_, err = file.WriteString(fmt.Sprintf("%d\n", value))
		if err != nil {
			return fmt.Errorf("failed to write to file %q: %w", sysfsBDIPath, err)
		}

		klog.Infof("Updated %s to %d", sysfsBDIPath, value)
	}

	return nil
}

func ApplySysfsConfig(targetMountPath string, sysfsBDI map[string]int64, mountOptions []string, logPrefix string) {
	if len(sysfsBDI) != 0 {
		go func() {
			if slices.Contains(mountOptions, fmt.Sprintf("%s=true", EnableGCSFuseKernelParams)) {
				klog.Warning("The mount option read_ahead_kb is soft deprecated for zonal buckets. GCSFuse automatically applies appropriate Read Ahead Kb kernel setting for best performance by default for Zonal Buckets.")
			}
			// updateSysfsConfig may hang until the file descriptor (fd) is either consumed or canceled.
			// It will succeed once gcsfuse finishes the mount process, or it will fail if gcsfuse fails
			// or the mount point is cleaned up due to mounting failures.
			if err := updateSysfsConfig(targetMountPath, sysfsBDI); err != nil {
				klog.Errorf("%v failed to update kernel parameters: %v", logPrefix, err)
			}
		}()
	}
}
