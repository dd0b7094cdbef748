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

package driver

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/googlecloudplatform/gcs-fuse-csi-driver/pkg/util"
	"github.com/googlecloudplatform/gcs-fuse-csi-driver/pkg/webhook"
	pbSanitizer "github.com/kubernetes-csi/csi-lib-utils/protosanitizer"
	"golang.org/x/mod/semver"
	"golang.org/x/net/context"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
)

const (
	CreateVolumeCSIFullMethod      = "/csi.v1.Controller/CreateVolume"
	DeleteVolumeCSIFullMethod      = "/csi.v1.Controller/DeleteVolume"
	NodePublishVolumeCSIFullMethod = "/csi.v1.Node/NodePublishVolume"

	// Do NOT add new VolumeAttributes without exporting them from the GKE
	// kubestore sawmill logs. See example in cl/833527120.

	// START of GCS Fuse Volume Attributes
	VolumeContextKeyMountOptions               = "mountOptions"
	VolumeContextKeyFileCacheCapacity          = "fileCacheCapacity"
	VolumeContextKeyFileCacheForRangeRead      = "fileCacheForRangeRead"
	VolumeContextKeyMetadataStatCacheCapacity  = "metadataStatCacheCapacity"
	VolumeContextKeyMetadataTypeCacheCapacity  = "metadataTypeCacheCapacity"
	VolumeContextKeyMetadataCacheTTLSeconds    = "metadataCacheTTLSeconds"
	VolumeContextKeyGcsfuseLoggingSeverity     = "gcsfuseLoggingSeverity"
	VolumeContextKeySkipCSIBucketAccessCheck   = "skipCSIBucketAccessCheck"
	VolumeContextKeyHostNetworkPodKSA          = "hostNetworkPodKSA"
	VolumeContextKeyIdentityProvider           = "identityProvider"
	VolumeContextKeyDisableMetrics             = "disableMetrics"
	VolumeContextKeyIdentityPool               = "identityPool"
	VolumeContextKeyMultiNICIndex              = "multiNICIndex"
	VolumeContextEnableCloudProfilerForSidecar = "enableCloudProfilerForSidecar"
	VolumeContextSharedNodeMount               = "sharedMount"
	// Legacy key, kept for backward compatibility
	//nolint:revive,stylecheck
	VolumeContextKeyMetadataCacheTtlSeconds = "metadataCacheTtlSeconds"
	// END of GCS Fuse Volume Attributes

	VolumeContextKeyServiceAccountName = "csi.storage.k8s.io/serviceAccount.name"
	//nolint:gosec
	VolumeContextKeyServiceAccountToken    = "csi.storage.k8s.io/serviceAccount.tokens"
	VolumeContextKeyPodName                = "csi.storage.k8s.io/pod.name"
	VolumeContextKeyPodNamespace           = "csi.storage.k8s.io/pod.namespace"
	VolumeContextKeyEphemeral              = "csi.storage.k8s.io/ephemeral"
	VolumeContextKeyBucketName             = "bucketName"
	TokenServerSidecarMinVersion           = "v1.17.2-gke.0" // #nosec G101
	SidecarBucketAccessCheckMinVersion     = "v1.20.0-gke.0"
	SidecarCloudProfilerMinVersion         = "v1.23.7-gke.0"
	MachineTypeAutoConfigSidecarMinVersion = "v1.15.1-gke.0" // #nosec G101
	GCSFuseProfilesMinVersion              = "v1.19.3-gke.0"
	GCSFuseFileCacheMediumMinVersion       = "v1.21.0-gke.0"
	GCSFuseKernelParamsMinVersion          = "v1.22.0-gke.0"
	MultiNICMinVersion                     = "v1.22.2-gke.0"
	SidecarAutoGoMemLimitMinVersion        = "v1.23.11-gke.0"
	StorageEndpointInternalMinVersion      = "v1.23.14-gke.0"
	FlagFileForDefaultingPath              = "flags-for-defaulting"
	GCSFuseProfileFlag                     = "profile"
	LocalSocketAddressArg                  = "experimental-local-socket-address"
	PublishContextKeyMounterPodName        = "mounter-pod-name"
	PublishContextKeyMounterPodNamespace   = "mounter-pod-namespace"
)

var (
	managedSidecarPatternAR  = `.*/gke-release(-staging)?/gcs-fuse-csi-driver-sidecar-mounter:v\d+\.\d+\.\d+-gke\.\d+\.*`
	managedSidecarRegexAR    = regexp.MustCompile(managedSidecarPatternAR)
	managedSidecarPatternGCR = `^(gke|staging-gke|master-gke)\.gcr\.io/gcs-fuse-csi-driver-sidecar-mounter:v\d+\.\d+\.\d+-gke\.\d+.*`
	managedSidecarRegexGCR   = regexp.MustCompile(managedSidecarPatternGCR)

	strictManagedSidecarPatternAR = `^(gcr\.io|[^/]*\.gcr\.io|[^/]*-docker\.pkg\.dev)/gke-release(-staging)?(/gke-release)?/gcs-fuse-csi-driver-sidecar-mounter:v\d+\.\d+\.\d+-gke\.\d+.*`
	strictManagedSidecarRegexAR   = regexp.MustCompile(strictManagedSidecarPatternAR)

	// Regex to detect deprecated flag error messages from gcsfuse. Should match the flags using .MarkDeprecated() in https://github.com/GoogleCloudPlatform/gcsfuse/blob/master/cfg/config.go
	deprecatedFlagPatterns = regexp.MustCompile(`Flag .*? has been deprecated`)
	// Regex to detect invalid argument error messages from gcsfuse. Should match the flags using InvalidValueError in https://github.com/spf13/pflag/blob/b85eb9e15911a41cd7c05d955503542e9befadf4/errors.go#L116,
	// imported by GCSFuse: https://github.com/GoogleCloudPlatform/gcsfuse/blob/fc54ba2287dba1ae4be0888686902f72e2f16f8b/go.mod#L34
	invalidArgumentPatterns = regexp.MustCompile(`invalid argument .* for .* flag`)
)

func NewVolumeCapabilityAccessMode(mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability_AccessMode {
	return &csi.VolumeCapability_AccessMode{Mode: mode}
}

// requestArgs holds digested request arguments, including fuse mount options. See parseRequestArguments.
type requestArgs struct {
	bucketName                    string
	userSpecifiedIdentityProvider string
	fuseMountOptions              []string
	skipCSIBucketAccessCheck      bool
	disableMetricsCollection      bool
	optInHostnetworkKSA           bool
	enableCloudProfilerForSidecar bool
	multiNICIndex                 int
}

func NewControllerServiceCapability(c csi.ControllerServiceCapability_RPC_Type) *csi.ControllerServiceCapability {
	return &csi.ControllerServiceCapability{
		Type: &csi.ControllerServiceCapability_Rpc{
			Rpc: &csi.ControllerServiceCapability_RPC{
				Type: c,
			},
		},
	}
}

func NewNodeServiceCapability(c csi.NodeServiceCapability_RPC_Type) *csi.NodeServiceCapability {
	return &csi.NodeServiceCapability{
		Type: &csi.NodeServiceCapability_Rpc{
			Rpc: &csi.NodeServiceCapability_RPC{
				Type: c,
			},
		},
	}
}

func logGRPC(ctx context.Context, req interface{}, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (interface{}, error) {
	var strippedReq string
	switch info.FullMethod {
	case CreateVolumeCSIFullMethod:
		strippedReq = pbSanitizer.StripSecrets(req).String()
	case DeleteVolumeCSIFullMethod:
		strippedReq = pbSanitizer.StripSecrets(req).String()
	case NodePublishVolumeCSIFullMethod:
		if nodePublishReq, ok := req.(*csi.NodePublishVolumeRequest); ok {
			if token, ok := nodePublishReq.GetVolumeContext()[VolumeContextKeyServiceAccountToken]; ok {
				nodePublishReq.VolumeContext[VolumeContextKeyServiceAccountToken] = "***stripped***"
				strippedReq = fmt.Sprintf("%+v", nodePublishReq)
				nodePublishReq.VolumeContext[VolumeContextKeyServiceAccountToken] = token
			} else {
				strippedReq = fmt.Sprintf("%+v", req)
			}
		} else {
			klog.Errorf("failed to case req to *csi.NodePublishVolumeRequest")
		}
	default:
		strippedReq = fmt.Sprintf("%+v", req)
	}

	klog.V(4).Infof("%s called with request: %v", info.FullMethod, strippedReq)
	resp, err := handler(ctx, req)
	if err != nil {
		klog.Errorf("%s failed with error: %v", info.FullMethod, err)
	} else {
		if fmt.Sprintf("%v", resp) == "" {
			klog.V(4).Infof("%s succeeded.", info.FullMethod)
		} else {
			klog.V(4).Infof("%s succeeded with response: %s", info.FullMethod, resp)
		}
	}

	return resp, err
}

// joinMountOptions joins mount options eliminating duplicates.
func joinMountOptions(existingOptions []string, newOptions []string) []string {
	overwritableOptions := map[string]string{
		"gid":       "",
		"file-mode": "",
		"dir-mode":  "",
	}

	ignorableOptions := map[string]bool{
		LocalSocketAddressArg: true,
	}

	ignoreOptionAlreadySeen := sets.NewString()
	allMountOptions := sets.NewString()

	process := func(mountOption string) {
		if len(mountOption) > 0 {
			optionPair := strings.SplitN(mountOption, "=", 2)

			if len(optionPair) == 2 {
				if _, ok := overwritableOptions[optionPair[0]]; ok {
					overwritableOptions[optionPair[0]] = optionPair[1]

					return
				}
				if _, found := ignoreOptionAlreadySeen[optionPair[0]]; found {
					return
				}
				if _, found := ignorableOptions[optionPair[0]]; found {
					ignoreOptionAlreadySeen.Insert(optionPair[0])
				}
			}

			allMountOptions.Insert(mountOption)
		}
	}

	for _, mountOption := range existingOptions {
		process(mountOption)
	}

	for _, mountOption := range newOptions {
		process(mountOption)
	}

	for k, v := range overwritableOptions {
		if v != "" {
			allMountOptions.Insert(k + "=" + v)
		}
	}

	return allMountOptions.List()
}

var volumeAttributesToMountOptionsMapping = map[string]string{
	VolumeContextKeyFileCacheCapacity:          "file-cache:max-size-mb:",
	VolumeContextKeyFileCacheForRangeRead:      "file-cache:cache-file-for-range-read:",
	VolumeContextKeyMetadataStatCacheCapacity:  "metadata-cache:stat-cache-max-size-mb:",
	VolumeContextKeyMetadataTypeCacheCapacity:  "metadata-cache:type-cache-max-size-mb:",
	VolumeContextKeyMetadataCacheTTLSeconds:    "metadata-cache:ttl-secs:",
	VolumeContextKeyMetadataCacheTtlSeconds:    "metadata-cache:ttl-secs:",
	VolumeContextKeyGcsfuseLoggingSeverity:     "logging:severity:",
	VolumeContextKeySkipCSIBucketAccessCheck:   "",
	VolumeContextKeyHostNetworkPodKSA:          "",
	VolumeContextKeyIdentityProvider:           "",
	VolumeContextKeyDisableMetrics:             util.DisableMetricsForGKE + ":",
	VolumeContextEnableCloudProfilerForSidecar: "",
}

// parseVolumeAttributes parses volume attributes and convert them to gcsfuse mount options.
func parseVolumeAttributes(fuseMountOptions []string, volumeContext map[string]string) (requestArgs, error) {
	if mountOptions, ok := volumeContext[VolumeContextKeyMountOptions]; ok {
		fuseMountOptions = joinMountOptions(fuseMountOptions, strings.Split(mountOptions, ","))
	}
	var args requestArgs
	for volumeAttribute, mountOption := range volumeAttributesToMountOptionsMapping {
		value, ok := volumeContext[volumeAttribute]
		if !ok {
			continue
		}

		var mountOptionWithValue string
		switch volumeAttribute {
		// parse Quantity volume attributes,
		// the input value should be a valid Quantity defined in https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/quantity/,
		// convert the input to a string representation in MB.
		case VolumeContextKeyFileCacheCapacity, VolumeContextKeyMetadataStatCacheCapacity, VolumeContextKeyMetadataTypeCacheCapacity:
			quantity, err := resource.ParseQuantity(value)
			if err != nil {
				return requestArgs{}, fmt.Errorf("volume attribute %v only accepts a valid Quantity value, got %q, error: %w", volumeAttribute, value, err)
			}

			megabytes := quantity.Value()
			switch {
			case megabytes < 0:
				value = "-1"
			case quantity.Format == resource.BinarySI:
				value = strconv.FormatInt(megabytes/1024/1024, 10)
			default:
				value = strconv.FormatInt(megabytes/1000/1000, 10)
			}

			mountOptionWithValue = mountOption + value

		// parse bool volume attributes
		case VolumeContextKeyFileCacheForRangeRead, VolumeContextKeySkipCSIBucketAccessCheck, VolumeContextKeyDisableMetrics, VolumeContextKeyHostNetworkPodKSA, VolumeContextEnableCloudProfilerForSidecar:
			if boolVal, err := strconv.ParseBool(value); err == nil {
				if volumeAttribute == VolumeContextKeySkipCSIBucketAccessCheck {
					args.skipCSIBucketAccessCheck = boolVal

					// The skipCSIBucketAccessCheck volume attribute is only for CSI driver,
					// and there is no translation to GCSFuse mount options.
					continue
				}

				if volumeAttribute == VolumeContextKeyHostNetworkPodKSA {
					args.optInHostnetworkKSA = boolVal
					continue
				}
				if volumeAttribute == VolumeContextEnableCloudProfilerForSidecar {
					args.enableCloudProfilerForSidecar = boolVal
					continue
				}
				if volumeAttribute == VolumeContextKeyDisableMetrics {
					args.disableMetricsCollection = boolVal
					// fallthrough to add this to fuseMountOptions too.
				}

				mountOptionWithValue = mountOption + strconv.FormatBool(boolVal)
			} else {
				return requestArgs{}, fmt.Errorf("volume attribute %v only accepts a valid bool value, got %q", volumeAttribute, value)
			}

		// parse int volume attributes
		case VolumeContextKeyMetadataCacheTTLSeconds, VolumeContextKeyMetadataCacheTtlSeconds:
			if intVal, err := strconv.Atoi(value); err == nil {
				if intVal < 0 {
					intVal = -1
				}

				mountOptionWithValue = mountOption + strconv.Itoa(intVal)
			} else {
				return requestArgs{}, fmt.Errorf("volume attribute %v only accepts a valid int value, got %q", volumeAttribute, value)
			}
		case VolumeContextKeyIdentityProvider:
			args.userSpecifiedIdentityProvider = value
		default:
			mountOptionWithValue = mountOption + value
		}

		fuseMountOptions = joinMountOptions(fuseMountOptions, []string{mountOptionWithValue})
	}
	args.fuseMountOptions = fuseMountOptions

	args.multiNICIndex = -1
	if idxString, found := volumeContext[VolumeContextKeyMultiNICIndex]; found {
		if idx, err := strconv.Atoi(idxString); err == nil {
			if idx < 0 {
				idx = -1
			}
			args.multiNICIndex = idx
		} else {
			return requestArgs{}, fmt.Errorf("volume attribute %v only accepts a valid int value, got %q", VolumeContextKeyMultiNICIndex, idxString)
		}
	}

	return args, nil
}

// parseRequestArguments parses volume arguments from the given CSI request parameters.
func parseRequestArguments(volumeID string, readOnly bool, volumeCapability *csi.VolumeCapability, vc map[string]string) (requestArgs, error) {
	bucketName := util.ParseVolumeID(volumeID)
	if vc[VolumeContextKeyEphemeral] == util.TrueStr {
		bucketName = vc[VolumeContextKeyBucketName]
		if len(bucketName) == 0 {
			return requestArgs{}, fmt.Errorf("VolumeContext %q must be provided for ephemeral storage", VolumeContextKeyBucketName)
		}
	}
	fuseMountOptions := []string{}
	if readOnly {
		fuseMountOptions = joinMountOptions(fuseMountOptions, []string{"ro"})
	}

	if capMount := volumeCapability.GetMount(); capMount != nil {
		// Delegate fsGroup to CSI Driver
		// Set gid, file-mode, and dir-mode for gcsfuse.
		// Allow users to overwrite these flags.
		if capMount.GetVolumeMountGroup() != "" {
			fuseMountOptions = joinMountOptions(fuseMountOptions, []string{"gid=" + capMount.GetVolumeMountGroup(), "file-mode=664", "dir-mode=775"})
		}
		fuseMountOptions = joinMountOptions(fuseMountOptions, capMount.GetMountFlags())
	}

	args, err := parseVolumeAttributes(fuseMountOptions, vc)
	args.bucketName = bucketName
	return args, err
}

// storageEndpointFromUniverseDomain returns the storage endpoint for the universe domain,
// in the format storage.UNIVERSE_DOMAIN:443. If no universe domain is provided, googleapis.com
// will be used as default.
func storageEndpointFromUniverseDomain(universeDomain string) string {
	if universeDomain == "" {
		universeDomain = "googleapis.com"
	}
	return fmt.Sprintf("storage.%s:443", universeDomain)
}

// overrideStorageEndpointInternal adds the storage-endpoint-internal flag to the mountOptions.
// If it already exists, it will be overridden.
func overrideStorageEndpointInternal(opts []string, storageEndpoint string) []string {
	prefix := fmt.Sprintf("%s=", util.StorageEndpointInternal)
	replacement := fmt.Sprintf("%s%s", prefix, storageEndpoint)
	newMountOptions := make([]string, 0, len(opts)+1)

	for _, opt := range opts {
		if strings.HasPrefix(opt, prefix) {
			if opt != replacement {
				// Log a warning if we are actively changing an existing value.
				klog.Warningf("Found flag %q, replaced with %q", opt, replacement)
			}
			// Skip adding the old/incorrect flag to the new slice.
			continue
		}
		newMountOptions = append(newMountOptions, opt)
	}

	// Always append the correct/updated flag at the end.
	return append(newMountOptions, replacement)
}

func putExitFile(pod *corev1.Pod, targetPath string) error {
	podIsTerminating := pod.DeletionTimestamp != nil
	podRestartPolicyIsNever := pod.Spec.RestartPolicy == corev1.RestartPolicyNever
	podRestartPolicyIsOnFailure := pod.Spec.RestartPolicy == corev1.RestartPolicyOnFailure

	// Check if all the containers besides the sidecar container exited
	if podRestartPolicyIsOnFailure || podRestartPolicyIsNever || podIsTerminating {
		if len(pod.Status.ContainerStatuses) == 0 {
			return nil
		}

		for _, cs := range pod.Status.ContainerStatuses {
			switch {
			// skip the sidecar container itself
			case cs.Name == webhook.GcsFuseSidecarName:
				continue

			// If the Pod is terminating, the container status from Kubernetes API is not reliable
			// because of the issue: https://github.com/kubernetes/kubernetes/issues/106896,
			// so container status checking is skipped.
			// Directly pulling the container status from CRI is not acceptable due to security concerns.
			// This will cause the issue https://github.com/GoogleCloudPlatform/gcs-fuse-csi-driver/issues/168.
			// The issue will be solved by the Kubernetes native sidecar container feature.
			case podIsTerminating:
				return nil

			// If any container is in Running or Waiting state,
			// do not terminate the gcsfuse sidecar container.
			case cs.State.Running != nil || cs.State.Waiting != nil:
				return nil

			// If the Pod RestartPolicy is OnFailure,
			// when the container terminated with a non-zero exit code,
			// the container may restart. Do not terminate the gcsfuse sidecar container.
			// When the Pod belongs to a Job, and the container restart count reaches the Job backoffLimit,
			// the Pod will be directly terminated, which goes to the first case.
			case podRestartPolicyIsOnFailure && cs.State.Terminated != nil && cs.State.Terminated.ExitCode != 0:
				return nil
			}
		}

		klog.V(4).Infof("[Pod %v/%v, UID %v] all the other containers terminated in the Pod, put the exit file.", pod.Namespace, pod.Name, pod.UID)
		emptyDirBasePath, err := util.PrepareEmptyDir(targetPath, false)
		if err != nil {
			return fmt.Errorf("failed to get emptyDir path: %w", err)
		}

		exitFilePath := filepath.Dir(emptyDirBasePath) + "/exit"
		exitParentDir := filepath.Dir(exitFilePath)

		// Pin the parent directory by opening its file descriptor with O_DIRECTORY and O_NOFOLLOW.
		// This locks the parent directory inode in memory, preventing concurrent TOCTOU symlink-swapping
		// attacks during subsequent relative operations (using unix.Openat).
		parentFd, err := unix.Open(exitParentDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
		if err != nil {
			return fmt.Errorf("failed to open parent directory %q: %w", exitParentDir, err)
		}
		defer unix.Close(parentFd)

		fd, err := unix.Openat(parentFd, filepath.Base(exitFilePath), unix.O_RDWR|unix.O_CREAT|unix.O_TRUNC|unix.O_NOFOLLOW, 0644)
		if err != nil {
			return fmt.Errorf("failed to securely open exit file: %w", err)
		}
		f := os.NewFile(uintptr(fd), exitFilePath)
		defer f.Close()
		if err := f.Chown(webhook.NobodyUID, webhook.NobodyGID); err != nil {
			return fmt.Errorf("failed to change ownership on the exit file: %w", err)
		}
	}

	return nil
}

func checkGcsFuseErr(isInitContainer bool, pod *corev1.Pod, targetPath string) (codes.Code, error) {
	cs, err := getSidecarContainerStatus(isInitContainer, pod)
	if err != nil {
		return codes.Internal, err
	}

	// the sidecar container has not started, skip the check
	if cs.State.Waiting != nil {
		return codes.OK, nil
	}

	emptyDirBasePath, err := util.PrepareEmptyDir(targetPath, false)
	if err != nil {
		return codes.Internal, fmt.Errorf("failed to get emptyDir path: %w", err)
	}

	errorFilePath := filepath.Join(emptyDirBasePath, util.ErrorFileName)
	klog.V(4).Infof("[Pod %v/%v] checking sidecar container error status", pod.Namespace, pod.Name)

	errMsg, err := extractErrorMsgFromGcsFuseErrorFile(errorFilePath)
	if err != nil {
		return codes.Internal, err
	}

	return extractErrorFromGcsFuseErrorFile(errMsg)
}

func extractErrorMsgFromGcsFuseErrorFile(errorFilePath string) ([]byte, error) {
	parentDir := filepath.Dir(errorFilePath)

	// Pin the parent directory by opening its file descriptor with O_DIRECTORY and O_NOFOLLOW.
	// This locks the parent directory inode in memory, preventing concurrent TOCTOU symlink-swapping
	// attacks during subsequent relative operations (using unix.Openat).
	parentFd, err := unix.Open(parentDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("failed to open parent directory %q: %w", parentDir, err)
	}
	defer unix.Close(parentFd)

	fd, err := unix.Openat(parentFd, filepath.Base(errorFilePath), unix.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("failed to open error file %q: %w", errorFilePath, err)
	}

	f := os.NewFile(uintptr(fd), errorFilePath)
	defer f.Close()

	errMsg, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("failed to read error file %q: %w", errorFilePath, err)
	}

	return errMsg, nil
}

func extractErrorFromGcsFuseErrorFile(errMsg []byte) (codes.Code, error) {
	if len(errMsg) > 0 {
		// TODO: We need a standard for scraping errors from GCSFuse.
		// A change in string format in GCSFuse would break this function.
		// If we are aware of such change, its also tedious to catch and
		// update tests that are hardcoded with this strings.
		errMsgStr := string(errMsg)
		code := codes.Internal
		if strings.Contains(errMsgStr, "Incorrect Usage") ||
			strings.Contains(errMsgStr, "unknown flag") || invalidArgumentPatterns.MatchString(errMsgStr) {
			code = codes.InvalidArgument
		}

		if strings.Contains(errMsgStr, "signal: killed") {
			code = codes.ResourceExhausted
		}

		if strings.Contains(errMsgStr, "signal: terminated") {
			code = codes.Canceled
		}

		if strings.Contains(errMsgStr, "googleapi: Error 403") ||
			strings.Contains(errMsgStr, "IAM returned 403 Forbidden: Permission") ||
			strings.Contains(errMsgStr, "google: could not find default credentials") ||
			strings.Contains(errMsgStr, "not have storage.objects.list access") {
			code = codes.PermissionDenied
		}

		if strings.Contains(errMsgStr, "bucket doesn't exist") {
			code = codes.NotFound
		}

		// Special case for harmless error message from gcsfuse stderr, gcsfuse cannot mute this because it stems from a needed library.
		if strings.Contains(errMsgStr, "[xds] Attempt to set a bootstrap configuration even though one is already set via environment variables.") {
			return codes.Unavailable, fmt.Errorf("benign grpc error: %s", errMsgStr)
		}

		if deprecatedFlagPatterns.MatchString(errMsgStr) {
			return codes.Unavailable, fmt.Errorf("benign error: %s", errMsgStr)
		}
		if strings.Contains(errMsgStr, util.StorageServiceErrorStr) {
			code = codes.Unauthenticated
		}
		if strings.Contains(errMsgStr, util.SidecarBucketAccessCheckErrorPrefix) {
			if code == codes.Internal {
				code = codes.Unavailable // Sidecar bucket access check retries on any failure to connect to the bucket or metadata service setup retries on any failure, so mark these as Unavailable to avoid SLO false triggers.
			}
			return code, fmt.Errorf("%v", errMsgStr) // Remember the error string already contains SidecarBucketAccessCheckErrorPrefix
		}
		return code, fmt.Errorf("gcsfuse failed with error: %v", errMsgStr)
	}
	return codes.OK, nil
}

func checkContainerStatusErr(cs *corev1.ContainerStatus) (codes.Code, error) {
	if cs == nil {
		return codes.Internal, errors.New("container status is nil")
	}

	code := codes.Internal
	var reason string
	var exitCode int32
	if cs.RestartCount > 0 && cs.LastTerminationState.Terminated != nil {
		reason = cs.LastTerminationState.Terminated.Reason
		exitCode = cs.LastTerminationState.Terminated.ExitCode
	} else if cs.State.Terminated != nil {
		reason = cs.State.Terminated.Reason
		exitCode = cs.State.Terminated.ExitCode
	}

	if exitCode != 0 {
		if reason == "OOMKilled" || exitCode == 137 {
			code = codes.ResourceExhausted
		}

		return code, fmt.Errorf("the %q container terminated due to %v, exit code: %v", cs.Name, reason, exitCode)
	}

	return codes.OK, nil
}

func getMounterPodContainerStatus(pod *corev1.Pod) (*corev1.ContainerStatus, error) {
	if pod == nil {
		return nil, errors.New("pod is nil")
	}
	for i := range pod.Status.ContainerStatuses {
		if strings.HasPrefix(pod.Status.ContainerStatuses[i].Name, util.MounterPodNamePrefix) {
			return &pod.Status.ContainerStatuses[i], nil
		}
	}
	return nil, errors.New("the mounter pod container was not found")
}

func getSidecarContainerStatus(isInitContainer bool, pod *corev1.Pod) (*corev1.ContainerStatus, error) {
	if pod == nil {
		return nil, errors.New("pod is nil")
	}
	var containerStatusList []corev1.ContainerStatus
	// Use ContainerStatuses or InitContainerStatuses
	if isInitContainer {
		containerStatusList = pod.Status.InitContainerStatuses
	} else {
		containerStatusList = pod.Status.ContainerStatuses
	}

	for i := range containerStatusList {
		if containerStatusList[i].Name == webhook.GcsFuseSidecarName {
			return &containerStatusList[i], nil
		}
	}

	return nil, errors.New("the sidecar container was not found")
}

func isManagedSidecarImage(imageName string) bool {
	return managedSidecarRegexAR.MatchString(imageName) || managedSidecarRegexGCR.MatchString(imageName)
}

func isStrictManagedSidecarImage(imageName string) bool {
	return strictManagedSidecarRegexAR.MatchString(imageName) || managedSidecarRegexGCR.MatchString(imageName)
}

func (d *GCSDriver) isSidecarVersionSupportedForGivenFeature(imageName string, sidecarMinSupportedVersion string) bool {
	if imageName == "" {
		return false
	}

	if d.config.AssumeGoodSidecarVersion {
		klog.V(4).Infof("Assuming good sidecar version from flag")
		return true
	}

	// If the image is from our non-managed testgrid, just assume the sidecar version is supported
	// since it's built off latest code in main
	klog.V(4).Infof("Doing version check to enable managed sidecar features for sidecar image %s, need minimum supported version %s", imageName, sidecarMinSupportedVersion)
	if strings.Contains(imageName, "prow-gob-internal-boskos") || strings.Contains(imageName, "oss-gcp-community") {
		return true
	}

	if !isManagedSidecarImage(imageName) {
		klog.Warningf("sidecarMinSupportedVersion check skipped since this %q is not a GKE managed image", imageName)
		return false
	}
	imageVersion := strings.Split(strings.Split(imageName, ":")[1], "@")[0]
	if semver.Compare(imageVersion, sidecarMinSupportedVersion) >= 0 {
		klog.Infof("managed sidecar version satisfies the minimum required version %q", sidecarMinSupportedVersion)
		return true
	}
	return false
}

func writeDriverFlagsFile(flagMap map[string]string, emptyDirBasePath string) error {
	if err := os.MkdirAll(emptyDirBasePath, 0750); err != nil {
		return fmt.Errorf("failed to create directory %q: %w", emptyDirBasePath, err)
	}

	absolutePath := filepath.Join(emptyDirBasePath, FlagFileForDefaultingPath)
	klog.V(4).Infof("Writing flags needed for gcsfuse defaulting logic to file %q: %v", absolutePath, flagMap)

	// Pin the parent directory by opening its file descriptor with O_DIRECTORY and O_NOFOLLOW.
	// This locks the parent directory inode in memory, preventing concurrent TOCTOU symlink-swapping
	// attacks during subsequent relative operations (using unix.Openat).
	parentFd, err := unix.Open(emptyDirBasePath, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("failed to open parent directory %q: %w", emptyDirBasePath, err)
	}
	defer unix.Close(parentFd)

	fd, err := unix.Openat(parentFd, FlagFileForDefaultingPath, unix.O_RDWR|unix.O_CREAT|unix.O_TRUNC|unix.O_NOFOLLOW, 0644)
	if err != nil {
		return fmt.Errorf("failed to securely open defaulting-flag file: %w", err)
	}
	f := os.NewFile(uintptr(fd), absolutePath)
	defer f.Close()

	content := prepareFileContentFromFlagMap(flagMap)
	if _, err := f.WriteString(content); err != nil {
		return fmt.Errorf("failed to write defaulting-flag file: %w", err)
	}

	return nil
}

func prepareFileContentFromFlagMap(flagMap map[string]string) string {
	var sb strings.Builder
	for key, value := range flagMap {
		sb.WriteString(key)
		sb.WriteString(":")
		sb.WriteString(value)
		sb.WriteString("\n")
	}
	return sb.String()
}

func ParseFlagMapFromFlagFile(flagFileContent string) map[string]string {
	configFlags := make(map[string]string)
	lines := strings.Split(flagFileContent, "\n")
	for _, line := range lines {
		key, value, found := strings.Cut(line, ":")
		if !found || key == "" {
			continue
		}
		configFlags[key] = value
	}
	return configFlags
}

// removeDisallowedMountOptions removes any flags in 'disallowedFlags' from fuse mount options
func removeDisallowedMountOptions(fuseMountOptions []string, disallowedFlags map[string]bool) []string {
	if len(disallowedFlags) == 0 {
		return fuseMountOptions
	}
	n := 0
	for _, item := range fuseMountOptions {
		parts := strings.FieldsFunc(item, func(r rune) bool {
			return r == ':' || r == '='
		})
		key := parts[0]

		if !disallowedFlags[key] {
			fuseMountOptions[n] = item
			n++
		}
	}
	return fuseMountOptions[:n]
}

// generateDisallowedFlagsMap generates a list of flags that should or shouldn't be passed to sidecar based on sidcar image version
func (driver *GCSDriver) generateDisallowedFlagsMap(gcsFuseSidecarImage string) map[string]bool {
	disallowedFlags := map[string]bool{}
	if gcsFuseSidecarImage == "" {
		return disallowedFlags
	}

	shouldPassProfilesFlag := driver.config.FeatureOptions.FeatureGCSFuseProfiles.EnableGcsfuseProfilesInternal && driver.isSidecarVersionSupportedForGivenFeature(gcsFuseSidecarImage, GCSFuseProfilesMinVersion)
	if !shouldPassProfilesFlag {
		disallowedFlags[GCSFuseProfileFlag] = true
	}

	shouldPassFileCacheMediumFlag := driver.config.FeatureOptions.FeatureGCSFuseProfiles.Enabled && driver.isSidecarVersionSupportedForGivenFeature(gcsFuseSidecarImage, GCSFuseFileCacheMediumMinVersion)
	if !shouldPassFileCacheMediumFlag {
		disallowedFlags[util.FileCacheMediumConst] = true
	}

	return disallowedFlags
}

func transformKeysToSet(inputMap map[string]string) map[string]struct{} {
	outputSet := make(map[string]struct{})
	for key := range inputMap {
		outputSet[key] = struct{}{}
	}
	return outputSet
}

func getInternalMountOptionValue(options []string, key string) string {
	for i := len(options) - 1; i >= 0; i-- {
		k, v, found := strings.Cut(options[i], "=")
		if k == key {
			if found {
				return v
			}
			return ""
		}
	}
	return ""
}
