/*
Copyright 2025 Google LLC

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

package profiles

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/googlecloudplatform/gcs-fuse-csi-driver/pkg/cloud_provider/clientset"
	profilesutil "github.com/googlecloudplatform/gcs-fuse-csi-driver/pkg/profiles/util"
	"github.com/googlecloudplatform/gcs-fuse-csi-driver/pkg/util"
	"github.com/googlecloudplatform/gcs-fuse-csi-driver/pkg/webhook"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	v1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
)

const (
	// StorageClass param keys.
	fuseFileCacheMediumPriorityKey           = "fuseFileCacheMediumPriority"
	fuseMemoryAllocatableFactorKey           = "fuseMemoryAllocatableFactor"
	fuseEphemeralStorageAllocatableFactorKey = "fuseEphemeralStorageAllocatableFactor"

	// Default values for StorageClass param keys.
	fuseFileCacheMediumPriorityDefaultVal           = "gpu:ram|lssd,tpu:ram,general_purpose:ram|lssd"
	fuseMemoryAllocatableFactorDefaultVal           = "0.7"
	fuseEphemeralStorageAllocatableFactorDefaultVal = "0.85"

	// Node allocatable resource keys.
	nvidiaGpuResourceName = corev1.ResourceName("nvidia.com/gpu")
	googleTpuResourceName = corev1.ResourceName("google.com/tpu")

	// Node types.
	nodeTypeTPU            = "tpu"
	nodeTypeGPU            = "gpu"
	nodeTypeGeneralPurpose = "general_purpose"

	// Standard medium names
	mediumRAM  = "ram"
	mediumLSSD = "lssd"

	// gkeAppliedNodeLabelsAnnotationKey is the annotation key that stores a comma-separated list of node labels.
	gkeAppliedNodeLabelsAnnotationKey = "node.gke.io/last-applied-node-labels"
	// EphemeralStorageLocalSSDLabelKey is the specific label key we are looking for within the applied labels.
	ephemeralStorageLocalSSDLabelKey = "cloud.google.com/gke-ephemeral-storage-local-ssd"

	// metadataStatCacheBytesPerObjectHNS is the average number of metadata stat cache bytes per object for an HNS bucket.
	metadataStatCacheBytesPerObjectHNS int64 = 1500
	// metadataStatCacheBytesPerObjectFlat is the average number of metadata stat cache bytes per object for a flat bucket.
	metadataStatCacheBytesPerObjectFlat int64 = 1700
	// mib represents 1024 * 1024 bytes.
	mib int64 = 1024 * 1024
	// The minimum size for the metadata stat cache size. The value is obtained from
	// https://docs.cloud.google.com/storage/docs/cloud-storage-fuse/cli-options#stat-cache-max-size-mb,
	// which claims that it's enough to cover up to 20,000 files.
	minMetadataStatCacheMBSize = 34

	// Mount option names.
	statCacheConfigFileKey = "metadata-cache:stat-cache-max-size-mb"
	fileCacheConfigFileKey = "file-cache:max-size-mb"
	statCacheCLIKey        = "stat-cache-max-size-mb"
	fileCacheCLIKey        = "file-cache-max-size-mb"
)

// ProfileConfig holds the consolidated configuration for a volume profile,
// derived from PersistentVolume annotations and StorageClass parameters.
type ProfileConfig struct {
	pvDetails   *pvDetails   // Details extracted from the PersistentVolume.
	nodeDetails *nodeDetails // Details extracted from the Node.
	scDetails   *scDetails   // Details extracted from the SC.
	podDetails  *podDetails  // Details extracted from the Pod.
}

// pvDetails holds a parsed summary of information about a PersistentVolume that are relevant to the recommender.
type pvDetails struct {
	numObjects     int64  // The number of objects reported by the PV.
	totalSizeBytes int64  // The total size in bytes reported by the PV.
	locationType   string // The location type of the bucket.
	name           string // The name of the PersistentVolume.
	hnsEnabled     bool   // True if the bucket has HNS enabled.
}

// nodeDetails holds a parsed summary of information about a Node that are relevant to the recommender.
type nodeDetails struct {
	nodeType                              string
	nodeAllocatables                      *parsedResourceList
	name                                  string // The name of the Node.
	hasLocalSSDEphemeralStorageAnnotation bool
}

// podDetails holds a parsed summary of information about a Pod that are relevant to the recommender.
type podDetails struct {
	containerLimits *parsedResourceList
	namespace       string
	name            string // The name of the Pod.
	containerName   string // The name of the container (sidecar or mounter).
	labels          map[string]string
}

// scDetails holds a parsed summary of information about a StorageClass that are relevant to the recommender.
type scDetails struct {
	fileCacheMediumPriority               map[string][]string // Parsed priority map for file cache mediums.
	fuseMemoryAllocatableFactor           float64             // Factor for calculating FUSE memory allocation.
	fuseEphemeralStorageAllocatableFactor float64             // Factor for calculating FUSE ephemeral storage allocation.
	volumeAttributes                      map[string]string   // Arbitrary volume attributes sourced from the StorageClass.
	mountOptions                          []string            // Mount options sourced from the StorageClass.
}

// parsedResourceList holds the parsed resource values from a pod spec.
type parsedResourceList struct {
	memoryBytes           int64
	ephemeralStorageBytes int64
}

// cacheRequirements defines the size constraints for various gcsfuse caches.
type cacheRequirements struct {
	// metadataStatCacheBytes is the maximum size (in bytes) for the metadata stat cache.
	metadataStatCacheBytes int64
	// fileCache is the maximum size (in bytes) for the file cache.
	fileCacheBytes int64
}

// cacheOverrides defines the cache requirements of the customer's overrides via their mountOptions.
type cacheOverrides struct {
	// metadataStatCacheBytes is the maximum size (in bytes) for the metadata stat cache. Nil means no override.
	metadataStatCacheBytes *int64
	// fileCache is the maximum size (in bytes) for the file cache. Nil means no override.
	fileCacheBytes *int64
}

// recommendation suggests optimal cache sizes based on certain criteria.
type recommendation struct {
	// metadataStatCacheBytes is the recommended size in bytes for the metadata stat cache.
	metadataStatCacheBytes int64
	// fileCacheBytes is the recommended size in bytes for the file cache.
	fileCacheBytes int64
	// fileCacheMedium is the recommended medium for file cache (ram or lssd).
	fileCacheMedium string
}

// BuildProfileConfigParams contains the parameters needed to build a profile configuration.
type BuildProfileConfigParams struct {
	VolumeName          string
	ContainerName       string
	TargetPath          string
	Clientset           clientset.Interface
	VolumeAttributeKeys map[string]struct{}
	NodeName            string
	IsInitContainer     bool
	Pod                 *corev1.Pod
}

// MergeVolumeAttributesOnRecommendedMissingKeys returns the a copy of the input map, merged with the profile's.
// recommended VolumeAttributes. This function respects the input's keys in the case of duplication.
func (c *ProfileConfig) MergeVolumeAttributesOnRecommendedMissingKeys(input map[string]string) map[string]string {
	if c == nil || c.scDetails == nil {
		return nil
	}
	return mergeMapsOnMissingKeys(input, c.scDetails.volumeAttributes)
}

// BuildProfileConfig constructs a ProfileConfig by fetching and validating
// information from the PV, Pod, SC, and Node relevant to the recommender.
// volumeAttributeKeys is used to filter parameters from the StorageClass that should be
// treated as volume attributes.
func BuildProfileConfig(params *BuildProfileConfigParams) (*ProfileConfig, error) {
	var volumeName string
	if params.TargetPath != "" {
		// Get the PV name from target path.
		var err error
		_, volumeName, err = util.ParsePodIDVolumeFromTargetpath(params.TargetPath)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "failed to get pv name from target path %q: %v", params.TargetPath, err)
		}
	} else {
		volumeName = params.VolumeName
	}

	if volumeName == "" {
		return nil, status.Error(codes.Internal, "volume name cannot be empty")
	}

	// Get the PV object using the PV name.
	pv, err := params.Clientset.GetPV(volumeName)
	if err != nil {
		if apierrors.IsNotFound(err) {
			// Skip the profiles feature for ephemeral volumes.
			klog.V(6).Infof("pv %q not found: %v, disabling profiles feature for this volume", volumeName, err)
			return nil, nil
		}
		return nil, status.Errorf(codes.Internal, "failed to get pv %q: %v", volumeName, err)
	}

	// Get the StorageClassName from the PV object.
	scName := pv.Spec.StorageClassName
	if scName == "" {
		klog.V(6).Infof("pv %q has empty StorageClassName, disabling profiles feature for this volume", pv.Name)
		return nil, nil
	}

	// Get the StorageClass object from the StorageClassName.
	sc, err := params.Clientset.GetSC(scName)
	if err != nil {
		if apierrors.IsNotFound(err) {
			klog.V(6).Infof("sc %q not found: %v, disabling profiles feature for this volume", scName, err)
			return nil, nil
		}
		return nil, status.Errorf(codes.Internal, "failed to get StorageClass %q: %v", scName, err)
	}

	if !profilesutil.IsProfile(sc) {
		klog.V(6).Infof("sc %q found but missing the profile label: %v, disabling profiles feature for this volume", scName, err)
		return nil, nil
	}

	// At this point, we are sure that the user is attempting to use the volume with
	// the profiles feature, so we start returning errors.

	// Get the scDetails from the StorageClass object.
	scDetails, err := buildSCDetails(pv, sc, params.VolumeAttributeKeys)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "failed to get StorageClass details: %v", err)
	}

	// Get the PV details from the PV object's annotations.
	pvDetails, err := buildPVDetails(pv)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "failed to get PV details from annotations for %q: %v", pv.Name, err)
	}

	// Get the Node object using the Node name.
	node, err := params.Clientset.GetNode(params.NodeName)
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, status.Errorf(codes.NotFound, "node %q not found: %v", params.NodeName, err)
		}
		return nil, status.Errorf(codes.Internal, "failed to get node %q: %v", params.NodeName, err)
	}

	// Get the nodeDetails from the Node object.
	nodeDetails, err := buildNodeDetails(node)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "failed to get node details: %v", err)
	}

	containerName := params.ContainerName
	if containerName == "" {
		return nil, status.Errorf(codes.Internal, "container name cannot be empty")
	}

	pod := params.Pod
	if pod == nil {
		return nil, status.Errorf(codes.Internal, "pod cannot be nil")
	}

	// Get the podDetails from the Pod object.
	podDetails, err := buildPodDetails(params.IsInitContainer, containerName, pod)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "failed to get pod details: %v", err)
	}

	return &ProfileConfig{
		pvDetails:   pvDetails,
		nodeDetails: nodeDetails,
		scDetails:   scDetails,
		podDetails:  podDetails,
	}, nil
}

// customFileCacheEnabled returns true if the user configured their own custom cache medium.
// https://cloud.google.com/kubernetes-engine/docs/how-to/cloud-storage-fuse-csi-driver-sidecar#configure-custom-read-cache-volume
func (config *ProfileConfig) customFileCacheEnabled() bool {
	if config == nil || config.podDetails == nil {
		return false
	}
	if cacheCreatedByUser, ok := config.podDetails.labels[webhook.GcsfuseCacheCreatedByUserLabel]; ok && cacheCreatedByUser == util.TrueStr {
		return true
	}
	return false
}

// Structured log format for GCSFuseCSIRecommendation
type GCSFuseCSIRecommendationLog struct {
	Severity string `json:"severity"`
	Message  string `json:"message"`
	Target   struct {
		PVName        string `json:"pvName"`
		NodeName      string `json:"nodeName"`
		PodName       string `json:"podName"`
		ContainerName string `json:"containerName,omitempty"`
	} `json:"target"`
	InputSignals struct {
		BucketTotalObjects                   int64  `json:"bucketTotalObjects"`
		BucketTotalDataSizeBytes             int64  `json:"bucketTotalDataSizeBytes"`
		BucketLocationType                   string `json:"bucketLocationType"`
		BucketHNSEnabled                     bool   `json:"bucketHNSEnabled"`
		RequiredFileCacheBytes               int64  `json:"requiredFileCacheBytes"`
		RequiredMetadataStatCacheBytes       int64  `json:"requiredMetadataStatCacheBytes"`
		NodeType                             string `json:"nodeType"`
		NodeAllocatableMemoryBytes           int64  `json:"nodeAllocatableMemoryBytes"`
		NodeAllocatableEphemeralStorageBytes int64  `json:"nodeAllocatableEphemeralStorageBytes"`
		NodeHasEphemeralStorageLSSD          bool   `json:"nodeHasEphemeralStorageLSSD"`
		ContainerLimitMemoryBytes            int64  `json:"containerLimitMemoryBytes"`
		ContainerLimitEphemeralStorageBytes  int64  `json:"containerLimitEphemeralStorageBytes"`
		FuseBudgetMemoryBytes                int64  `json:"fuseBudgetMemoryBytes"`
		FuseBudgetEphemeralStorageBytes      int64  `json:"fuseBudgetEphemeralStorageBytes"`
	} `json:"inputSignals"`
	Decision struct {
		MetadataStatCacheBytes int64  `json:"metadataStatCacheBytes"`
		FileCacheBytes         int64  `json:"fileCacheBytes"`
		FileCacheMedium        string `json:"fileCacheMedium"`
	} `json:"decision"`
}

// logRecommendation logs a summary of the decisions made by the recommender. Users can click on the message
// to expand a JSON log with input signals, target information, and decisions used for a complete understanding
// of the recommendation.
func logRecommendation(config *ProfileConfig, recommendation *recommendation, requirement *cacheRequirements, overrides *cacheOverrides, memoryBudget, ephemeralStorageBudget int64) error {
	summaryMessage := fmt.Sprintf("GCSFuseCSIRecommendation: Recommended cache configs for PV %s and Pod %s/%s:", config.pvDetails.name, config.podDetails.namespace, config.podDetails.name)

	// File cache
	summaryMessage = fmt.Sprintf("%s FileCache: %dMiB", summaryMessage, bytesToMiB(recommendation.fileCacheBytes))
	if overrides != nil && overrides.fileCacheBytes != nil {
		summaryMessage = fmt.Sprintf("%s (override)", summaryMessage)
	} else if recommendation.fileCacheMedium != "" {
		summaryMessage = fmt.Sprintf("%s (%s)", summaryMessage, recommendation.fileCacheMedium)
	}

	// Metadata stat cache
	summaryMessage = fmt.Sprintf("%s | MetadataStatCache: %dMiB", summaryMessage, bytesToMiB(recommendation.metadataStatCacheBytes))
	if overrides != nil && overrides.metadataStatCacheBytes != nil {
		summaryMessage = fmt.Sprintf("%s (override)", summaryMessage)
	} else if recommendation.metadataStatCacheBytes < requirement.metadataStatCacheBytes && requirement.metadataStatCacheBytes > 0 {
		summaryMessage = fmt.Sprintf("%s (capped)", summaryMessage)
	}

	// The full JSON log below is only visibile until the user clicks on the message and expands it.
	summaryMessage = fmt.Sprintf("%s | Expand for full details", summaryMessage)

	logEntry := GCSFuseCSIRecommendationLog{
		Severity: "INFO",
		Message:  summaryMessage,
	}

	// Target
	logEntry.Target.PVName = config.pvDetails.name
	logEntry.Target.NodeName = config.nodeDetails.name
	logEntry.Target.PodName = fmt.Sprintf("%s/%s", config.podDetails.namespace, config.podDetails.name)
	logEntry.Target.ContainerName = config.podDetails.containerName

	// Requirements
	logEntry.InputSignals.RequiredFileCacheBytes = requirement.fileCacheBytes
	logEntry.InputSignals.RequiredMetadataStatCacheBytes = requirement.metadataStatCacheBytes

	// Bucket signals
	logEntry.InputSignals.BucketTotalObjects = config.pvDetails.numObjects
	logEntry.InputSignals.BucketTotalDataSizeBytes = config.pvDetails.totalSizeBytes
	logEntry.InputSignals.BucketLocationType = config.pvDetails.locationType
	logEntry.InputSignals.BucketHNSEnabled = config.pvDetails.hnsEnabled

	// Node signals
	logEntry.InputSignals.NodeType = config.nodeDetails.nodeType
	logEntry.InputSignals.NodeAllocatableMemoryBytes = config.nodeDetails.nodeAllocatables.memoryBytes
	logEntry.InputSignals.NodeAllocatableEphemeralStorageBytes = config.nodeDetails.nodeAllocatables.ephemeralStorageBytes
	logEntry.InputSignals.NodeHasEphemeralStorageLSSD = config.nodeDetails.hasLocalSSDEphemeralStorageAnnotation

	// Pod signals
	logEntry.InputSignals.ContainerLimitMemoryBytes = config.podDetails.containerLimits.memoryBytes
	logEntry.InputSignals.ContainerLimitEphemeralStorageBytes = config.podDetails.containerLimits.ephemeralStorageBytes

	// Resource budgets are min(node allocatable, sidecar limit) * allocatable factor, i.e budget available for this resource for the fuse process.
	logEntry.InputSignals.FuseBudgetMemoryBytes = memoryBudget
	logEntry.InputSignals.FuseBudgetEphemeralStorageBytes = ephemeralStorageBudget

	// Decision
	logEntry.Decision.MetadataStatCacheBytes = recommendation.metadataStatCacheBytes
	logEntry.Decision.FileCacheBytes = recommendation.fileCacheBytes
	logEntry.Decision.FileCacheMedium = recommendation.fileCacheMedium

	// Marshal the struct to JSON
	logJSON, err := json.Marshal(logEntry)
	if err != nil {
		return fmt.Errorf("failed to marshal json: %v", err)
	}
	// Print the JSON string directly to standard output so it doesn't look like an error.
	// This bypasses klog's prefixing and one-line formatting.
	fmt.Println(string(logJSON))
	return nil
}

// MergeRecommendedMountOptionsOnMissingKeys generates a slice of recommended mount options for GCS FUSE based on the provided ProfileConfig.
// It calculates optimal cache configurations and translates them into gcsfuse mount option strings.
// If the user provides any of the following mount options:
//   - "metadata-cache:stat-cache-max-size-mb"
//   - "file-cache:max-size-mb"
//
// the cache recommendation be best effort, respecting the user's mount options in the case of duplication.
// If a custom file cache medium is specified, file cache recommendation will be skipped, since the medium size
// will be unknowable.
func (config *ProfileConfig) MergeRecommendedMountOptionsOnMissingKeys(userMountOptions []string) ([]string, error) {
	if config == nil {
		return nil, status.Errorf(codes.Internal, "config cannot be nil")
	}

	// Start with merging the pre-bundled StorageClass mount option recommendations into the user's mount options,
	// respecting user's mount options in the case of duplicates.
	recommendedMountOptions, err := mergeMountOptionsOnMissingKeys(userMountOptions, config.scDetails.mountOptions)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "failed to merge mount options: %v", err)
	}

	recommendation, err := recommendCacheConfigs(recommendedMountOptions, config)
	if err != nil {
		return nil, fmt.Errorf("failed to recommend cache configs: %v", err)
	}

	cacheOptions := []string{}

	// Map the recommended cache sizes and medium recommendations to mount options.
	// The mount options must be passed, even if they are set to zero, in order to override
	// GCSFuse's --profile flag.
	for moKey, bytes := range map[string]int64{
		statCacheConfigFileKey: recommendation.metadataStatCacheBytes,
		fileCacheConfigFileKey: recommendation.fileCacheBytes,
	} {
		cacheOptions = append(cacheOptions, fmt.Sprintf("%s:%d", moKey, bytesToMiB(bytes)))
	}

	// Only pass the file cache medium if file cache is enabled.
	if recommendation.fileCacheBytes != 0 && recommendation.fileCacheMedium != "" {
		// Note: File cache medium *must* be delimeted with an "=" sign, since it's an internal CSI flag.
		cacheOptions = append(cacheOptions, fmt.Sprintf("%s=%s", util.FileCacheMediumConst, recommendation.fileCacheMedium))
	}

	// Merge the final cache mount options to the recommended mount options, respecting the user's mount options in the case of duplication.
	recommendedMountOptions, err = mergeMountOptionsOnMissingKeys(recommendedMountOptions, cacheOptions)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "failed to merge mount options: %v", err)
	}
	return recommendedMountOptions, nil
}

// buildCacheRequirements constructs a cacheRequirements struct based on the provided pvDetails.
// It calculates the ideal sizes for metadata stat and file caches.
func buildCacheRequirements(pvDetails *pvDetails) *cacheRequirements {
	reqs := cacheRequirements{
		fileCacheBytes: pvDetails.totalSizeBytes,
	}

	// Calculate the estimated stat cache for HNS and flat buckets.
	// In the future, we should consider implicit dirs and separating
	// files from directories for a more accurate approximation.
	statCacheAvgBytesPerFile := metadataStatCacheBytesPerObjectFlat
	if pvDetails.hnsEnabled {
		statCacheAvgBytesPerFile = metadataStatCacheBytesPerObjectHNS
	}
	reqs.metadataStatCacheBytes = pvDetails.numObjects * statCacheAvgBytesPerFile
	minMetadataStatCacheBytes := mibToBytes(minMetadataStatCacheMBSize)

	if reqs.metadataStatCacheBytes < minMetadataStatCacheBytes {
		// If the bucket is empty or has very few objects, use a minimum value instead of disabling the metadata stat cache,
		// since files may be created later.
		klog.V(6).Infof("Required metadata stat cache bytes %d is smaller than the minimum recommended: %d, using the minimum recommended instead.", reqs.metadataStatCacheBytes, minMetadataStatCacheBytes)
		reqs.metadataStatCacheBytes = minMetadataStatCacheBytes
	}
	if isZonalBucket(pvDetails.locationType) {
		klog.Infof("Bucket location type is %q, file cache not required. Disabling file cache.", pvDetails.locationType)
		reqs.fileCacheBytes = 0
	}
	return &reqs
}

// calculateFuseResourceBudget determines the memory or ephemeral storage budget available for GCS FUSE.
// It takes the node's allocatable capacity, a factor for FUSE allocation, and an optional container limit.
func calculateFuseResourceBudget(nodeAllocatable int64, allocatableFactor float64, containerLimit int64) int64 {
	budget := nodeAllocatable
	// If the container has "0" resource limit, then we assume the entire node allocatable is available.
	// Otherwise, cap the max fuse resource to the container's limit.
	if containerLimit > 0 && containerLimit < nodeAllocatable {
		budget = containerLimit
	}
	// Return x% of the available budget, determined by the allocatable factor variable.
	return int64(float64(budget) * allocatableFactor)
}

// calculateResourceBudgets computes the memory and ephemeral storage budgets available for GCS FUSE
// based on the node and pod resource configurations in the ProfileConfig.
func calculateResourceBudgets(config *ProfileConfig) (int64, int64) {
	// Calculate memory budget
	memoryBudget := calculateFuseResourceBudget(
		config.nodeDetails.nodeAllocatables.memoryBytes,
		config.scDetails.fuseMemoryAllocatableFactor,
		config.podDetails.containerLimits.memoryBytes,
	)

	// Calculate ephemeral storage budget
	ephemeralStorageBudget := calculateFuseResourceBudget(
		config.nodeDetails.nodeAllocatables.ephemeralStorageBytes,
		config.scDetails.fuseEphemeralStorageAllocatableFactor,
		config.podDetails.containerLimits.ephemeralStorageBytes,
	)

	return memoryBudget, ephemeralStorageBudget
}

// recommendCacheConfigs calculates recommended cache sizes and medium.
func recommendCacheConfigs(mountOptions []string, config *ProfileConfig) (*recommendation, error) {
	// Validate input.
	if config.pvDetails == nil {
		return nil, status.Errorf(codes.Internal, "pvDetails cannot be nil")
	}
	if config.scDetails == nil {
		return nil, status.Errorf(codes.Internal, "scDetails cannot be nil")
	}
	if config.nodeDetails == nil {
		return nil, status.Errorf(codes.Internal, "nodeDetails cannot be nil")
	}
	if config.podDetails == nil {
		return nil, status.Errorf(codes.Internal, "podDetails cannot be nil")
	}

	recommendation := &recommendation{}

	// Calculate metadata and file cache requirements.
	cacheRequirements := buildCacheRequirements(config.pvDetails)

	// Calculate memory and ephemeral storage budgets.
	memoryBudget, ephemeralStorageBudget := calculateResourceBudgets(config)

	// Parse cache overrides found either in the customer's mount options or profile StorageClass.
	cacheOverrides, err := config.parseCacheOverrides(mountOptions)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "failed to parse cache overrides: %v", err)
	}

	// Calculate metadata stat cache size.
	recommendation.metadataStatCacheBytes, memoryBudget = recommendMetadataStatCacheSize(config, cacheRequirements.metadataStatCacheBytes, memoryBudget, cacheOverrides.metadataStatCacheBytes)

	// Calculate file cache size and medium selection.
	recommendation.fileCacheBytes, recommendation.fileCacheMedium, err = recommendFileCacheSizeAndMedium(cacheRequirements.fileCacheBytes, cacheOverrides.fileCacheBytes, config, memoryBudget, ephemeralStorageBudget)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "failed to recommend file cache: %v", err)
	}

	if err := logRecommendation(config, recommendation, cacheRequirements, cacheOverrides, memoryBudget, ephemeralStorageBudget); err != nil {
		return nil, status.Errorf(codes.Internal, "failed to log recommendation: %v", err)
	}
	return recommendation, nil
}

// recommendFileCacheSizeAndMedium determines the optimal file cache size and medium.
// It iterates through a prioritized list of storage mediums (e.g., RAM, LSSD) based on the `config.nodeDetails.nodeType`.
// For each medium, it checks if the `cacheRequirements.fileCacheBytes` can be satisfied within the provided
// `memoryBudget` or `ephemeralStorageBudget`, also considering node-specific limitations like LSSD availability.
// The first suitable medium found in the priority list is returned along with the required cache size.
// If no medium can satisfy the requirements, it returns 0 bytes and an empty string, indicating the file cache should be disabled.
func recommendFileCacheSizeAndMedium(required int64, override *int64, config *ProfileConfig, memoryBudget, ephemeralStorageBudget int64) (int64, string, error) {
	// If the customer overrided the file cache max size, disable smart recommendations and use their value.
	if override != nil {
		klog.Warningf("File cache size override detected: %d MiB, disabling smart file cache recommendation.", bytesToMiB(*override))
		return *override, "", nil
	}
	// If the customer configured a custom read cache volume, disable smart recommendations and use their medium.
	if config.customFileCacheEnabled() {
		// Since they didn't specify a file cache size override, set the value to infinite, since we can't know their medium size,
		// because it could literally be anything. -1 is the default value when cache-dir
		// it set on GCSFuse: https://docs.cloud.google.com/storage/docs/cloud-storage-fuse/cli-options#file-cache-max-size-mb
		klog.Warningf("File cache medium override detected, disabling smart file cache recommendation.")
		return -1, "", nil
	}

	// Determine priority list & perform node type specific checks
	priorityList, found := config.scDetails.fileCacheMediumPriority[config.nodeDetails.nodeType]
	if !found {
		return 0, "", fmt.Errorf("no file cache medium priority list found for node type %q", config.nodeDetails.nodeType)
	}
	klog.V(6).Infof("Using file cache medium priority list for node type %q: %v", config.nodeDetails.nodeType, priorityList)

	// Skip medium evaluation if no file cache is required
	if required == 0 {
		klog.V(6).Infof("File cache not required (%d bytes). Skipping medium evaluation", required)
		return 0, "", nil
	}

	for i, medium := range priorityList {
		klog.V(6).Infof("Evaluating medium %q (Priority %d/%d)", medium, i+1, len(priorityList))
		switch medium {
		case util.MediumRAM:
			// Check if the required file cache bytes fit into the available memory (RAM) medium.
			if required <= memoryBudget {
				return required, medium, nil
			}
		case util.MediumLSSD:
			if config.nodeDetails.nodeType == nodeTypeTPU {
				// The customer may have accidentally put LSSD in the priority list for TPU. Fallback to RAM, since it's the only option.
				klog.Warningf("Medium %q on node type %q is not supported, but was found in priority list %v. Falling back to RAM.", medium, config.nodeDetails.nodeType, priorityList)
				if required <= memoryBudget {
					return required, util.MediumRAM, nil
				}
				break
			}
			if !config.nodeDetails.hasLocalSSDEphemeralStorageAnnotation {
				klog.Warningf("Medium %q skipped on node type %q: Node annotation %q is not 'true'.", medium, config.nodeDetails.nodeType, ephemeralStorageLocalSSDLabelKey)
				break
			}
			// Check if the required file cache bytes fit into the available ephemeral storage medium.
			if required <= ephemeralStorageBudget {
				return required, medium, nil
			}
		default:
			return 0, "", fmt.Errorf("unknown storage medium: %q", medium)
		}
	}

	// If the customer didn't specify any override, disable the file cache to protect against thrashing or starving the host of memory / ephemeral storage.
	klog.Warningf("No suitable file cache medium found or requirement exceeded limits for all options based on priority list %v and available resources for node type %q. Disabling file cache.", priorityList, config.nodeDetails.nodeType)
	return 0, "", nil
}

// recommendMetadataStatCacheSize determines the recommended size for metadata stat cache,
// ensuring it does not exceed the available memoryBudget.
// It returns the recommended size and the remaining memory budget.
func recommendMetadataStatCacheSize(config *ProfileConfig, required, memoryBudget int64, override *int64) (int64, int64) {
	// Handle customer override.
	if override != nil {
		switch *override {
		case -1:
			// If the override is infinite, respect the override, but decrement
			// the memory budget for the next recommendation, since we assume
			// that all of the estimated cache size could be used up.
			if required > memoryBudget {
				klog.Warningf("For target node %s, metadata stat cache size override is infinite (-1). The estimated size for the cache is %d MiB, which is greater than the memory budget %d MiB. This may cause the host to OOM.", config.nodeDetails.name, bytesToMiB(required), bytesToMiB(memoryBudget))
			}
			memoryBudget = maxInt64(0, memoryBudget-required)
			klog.V(6).Infof("Available memory after metadata stat cache: %d bytes.", memoryBudget)
			return *override, memoryBudget
		default:
			// If the override is set to a finite value, respect the override, but
			// warn the customer if the override exceeds the memory budget.
			if *override > memoryBudget {
				klog.Warningf("For target node %s, metadata stat cache size %d MiB override is greater than the memory budget %d MiB. This may cause the host to OOM.", config.nodeDetails.name, bytesToMiB(*override), bytesToMiB(memoryBudget))
			}
			memoryBudget = maxInt64(0, memoryBudget-*override)
			return *override, memoryBudget
		}
	}

	// If no override, recommend a metadata cache size.
	recommended := minInt64(required, memoryBudget)
	if recommended < required && required > 0 {
		// TODO(urielguzman): Log this in a Kubernetes Pod event warning.
		klog.Warningf("For target node %s, required metadata stat cache size %d MiB capped to available fuse memory budget %d MiB. This can impact perf due to increased GCS metadata API calls.", config.nodeDetails.name, bytesToMiB(required), bytesToMiB(recommended))
	}
	memoryBudget = maxInt64(0, memoryBudget-recommended)
	klog.V(6).Infof("Available memory after metadata stat cache: %d bytes.", memoryBudget)
	return recommended, memoryBudget
}

// parseFloatParameterNonNegative extracts a parameter by key from the params map,
// parses it as a float64, and returns an error if the value
// is not a valid float, or the value is negative. If the value is not found, it defaults
// to an internal value.
func parseFloatParameterNonNegative(pv *corev1.PersistentVolume, sc *storagev1.StorageClass, key, defaultVal string) (float64, error) {
	stringVal := profilesutil.AttributeWithSCFallback(pv, sc, key, defaultVal)
	floatVal, err := strconv.ParseFloat(stringVal, 64)
	if err != nil {
		return 0, fmt.Errorf("failed to parse %q: %w", key, err)
	}
	if floatVal < 0 {
		return 0, fmt.Errorf("%q is < 0", key)
	}
	return floatVal, nil
}

// parseFileCacheMediumPriority parses a comma-separated string of key:value pairs
// into a map. Each value can be a pipe-separated list of strings.
// Example input: "hdd:val1|val2,ssd:val3"
// Output: {"hdd": ["val1", "val2"], "ssd": ["val3"]}
// It returns an error if the input string is malformed.
func parseFileCacheMediumPriority(input string) (map[string][]string, error) {
	result := make(map[string][]string)
	if strings.TrimSpace(input) == "" {
		return result, nil
	}
	pairs := strings.Split(input, ",")
	for i, pair := range pairs {
		pair = strings.TrimSpace(pair)
		if pair == "" {
			continue
		}
		parts := strings.SplitN(pair, ":", 2)
		if len(parts) != 2 {
			return nil, fmt.Errorf("malformed pair found at index %d: %q", i, pair)
		}
		key := strings.TrimSpace(parts[0])
		valueString := strings.TrimSpace(parts[1])
		if key == "" {
			return nil, fmt.Errorf("found pair with empty key at index %d: %q", i, pair)
		}
		var values []string
		if valueString != "" {
			rawValues := strings.Split(valueString, "|")
			for _, val := range rawValues {
				trimmedVal := strings.TrimSpace(val)
				if trimmedVal != "" {
					values = append(values, trimmedVal)
				}
			}
		}
		result[key] = values
	}
	return result, nil
}

// buildPVDetails extracts and parses the number of objects and total size
// annotations from the given PersistentVolume. It returns a pvDetails struct containing
// the parsed values. An error is returned if the required annotations are missing,
// empty, or cannot be parsed into their expected integer types.
func buildPVDetails(
	pv *corev1.PersistentVolume) (*pvDetails, error) {
	// Extract annotations
	pvAnnotations := pv.GetAnnotations()
	if pvAnnotations == nil {
		// Return internal error, since the mount shouldn't have started if the PV hasn't finished scanning.
		return nil, fmt.Errorf("PV %q has no annotations", pv.Name)
	}

	// Get annotation values as strings
	numObjectsStr, numObjectsFound := pvAnnotations[profilesutil.AnnotationNumObjects]
	totalSizeStr, totalSizeFound := pvAnnotations[profilesutil.AnnotationTotalSize]

	// Check for missing annotations
	var missingAnnotations []string
	if !numObjectsFound {
		missingAnnotations = append(missingAnnotations, profilesutil.AnnotationNumObjects)
	}
	if !totalSizeFound {
		missingAnnotations = append(missingAnnotations, profilesutil.AnnotationTotalSize)
	}

	if len(missingAnnotations) > 0 {
		// Return internal error, since the mount shouldn't have started if the PV hasn't finished scanning.
		return nil, fmt.Errorf("PV %q is missing required annotations: %s", pv.Name, strings.Join(missingAnnotations, ", "))
	}

	// Parse annotations into int64
	var parseErrors []string
	numObjects, err := strconv.ParseInt(numObjectsStr, 10, 64)
	if err != nil {
		parseErrors = append(parseErrors, fmt.Sprintf("failed to parse %s value %q: %v", profilesutil.AnnotationNumObjects, numObjectsStr, err))
	}
	totalSizeBytes, err := strconv.ParseInt(totalSizeStr, 10, 64)
	if err != nil {
		parseErrors = append(parseErrors, fmt.Sprintf("failed to parse %s value %q: %v", profilesutil.AnnotationTotalSize, totalSizeStr, err))
	}
	if len(parseErrors) > 0 {
		errorMsg := strings.Join(parseErrors, "; ")
		// Return internal error, since the annotations should have been validated either by GCW or the scanner controller.
		return nil, fmt.Errorf("invalid annotation format on PV %q: %s", pv.Name, errorMsg)
	}

	// Parse the location type.
	locationType := pvAnnotations[profilesutil.AnnotationLocationType]

	// Parse the HNS enabled annotation.
	hnsEnabled := pvAnnotations[profilesutil.AnnotationHNSEnabled] == util.TrueStr

	return &pvDetails{
		name:           pv.Name,
		numObjects:     numObjects,
		totalSizeBytes: totalSizeBytes,
		locationType:   locationType,
		hnsEnabled:     hnsEnabled,
	}, nil
}

// buildNodeDetails extracts and processes information from a Kubernetes Node object
// to populate and return a nodeDetails struct. It parses allocatable resources,
// determines the node type (General Purpose, GPU, TPU), and checks for specific
// annotations like local SSD ephemeral storage.
func buildNodeDetails(node *corev1.Node) (*nodeDetails, error) {
	// Parse the node allocatables from the node.
	nodeAllocatables, err := parseResourceList(node.Status.Allocatable)
	if err != nil {
		return nil, fmt.Errorf("failed to parse node allocatable resources from node %q: %v", node.Name, err)
	}

	// Get the node type from the node.
	nodeType := nodeTypeGeneralPurpose
	if isGpuNodeByResource(node) {
		nodeType = nodeTypeGPU
	} else if isTpuNodeByResource(node) {
		nodeType = nodeTypeTPU
	}

	return &nodeDetails{
		nodeType:                              nodeType,
		nodeAllocatables:                      nodeAllocatables,
		name:                                  node.Name,
		hasLocalSSDEphemeralStorageAnnotation: hasLocalSSDEphemeralStorageAnnotation(node.Annotations),
	}, nil
}

// buildPodDetails extracts resource limit information for the container
// from a given corev1.Pod. The isInitContainer boolean specifies whether to look
// within the Pod's InitContainers or its Containers.
// It uses getContainerResourceRequirements to find the container's resource requirements
// and then calls parseResourceList to process the Limits.
// It returns a pointer to a podDetails struct or an error if parsing the resource limits fails.
func buildPodDetails(isInitContainer bool, containerName string, pod *corev1.Pod) (*podDetails, error) {
	// Get the container limits from the Pod.
	containerLimits, err := parseResourceList(getContainerResourceRequirements(isInitContainer, pod, containerName).Limits)
	if err != nil {
		return nil, fmt.Errorf("failed to parse gcsfuse container resource list from pod %q: %v", pod.Name, err)
	}

	return &podDetails{
		namespace:       pod.Namespace,
		name:            pod.Name,
		containerName:   containerName,
		containerLimits: containerLimits,
		labels:          pod.Labels,
	}, nil
}

// getContainerResourceRequirements finds the corev1.ResourceRequirements for the
// specified container within a provided corev1.Pod.
// The isInitContainer flag dictates whether the function searches in pod.Spec.InitContainers
// or pod.Spec.Containers.
func getContainerResourceRequirements(isInitContainer bool, pod *corev1.Pod, containerName string) corev1.ResourceRequirements {
	if pod == nil {
		return corev1.ResourceRequirements{}
	}

	var containers []corev1.Container
	if isInitContainer {
		containers = pod.Spec.InitContainers
	} else {
		containers = pod.Spec.Containers
	}

	for _, container := range containers {
		if container.Name == containerName {
			return container.Resources
		}
	}
	return corev1.ResourceRequirements{}
}

// buildSCDetails extracts and validates parameters from a Kubernetes StorageClass
// object to populate and return an scDetails struct. It checks for required
// parameters like fuseFileCacheMediumPriority, parses
// numeric factors, and selects volume attributes based on the provided
// volumeAttributeKeys. An error is returned if any mandatory parameters are
// missing or invalid.
func buildSCDetails(pv *corev1.PersistentVolume, sc *v1.StorageClass, volumeAttributeKeys map[string]struct{}) (*scDetails, error) {
	// Get the parameters from the StorageClass.
	if sc.Parameters == nil {
		return nil, fmt.Errorf("sc %q found but has nil Parameters map", sc.Name)
	}

	// Get the file cache medium priority from the StorageClass parameters (or PV override).
	fileCacheMediumPriorityStr := profilesutil.AttributeWithSCFallback(pv, sc, fuseFileCacheMediumPriorityKey, fuseFileCacheMediumPriorityDefaultVal)
	fileCacheMediumPriority, err := parseFileCacheMediumPriority(fileCacheMediumPriorityStr)
	if err != nil {
		return nil, fmt.Errorf("failed to parse fuseFileCacheMediumPriority in StorageClass %q: %v", sc.Name, err)
	}

	// Get the fuse memory allocatable factor from the StorageClass parameters (or PV override).
	fuseMemoryAllocatableFactor, err := parseFloatParameterNonNegative(pv, sc, fuseMemoryAllocatableFactorKey, fuseMemoryAllocatableFactorDefaultVal)
	if err != nil {
		return nil, fmt.Errorf("failed to parse fuse memory allocatable factor param in StorageClass %q: %v", sc.Name, err)
	}

	// Get the fuse ephemeral storage allocatable factor from the StorageClass parameters.
	fuseEphemeralStorageAllocatableFactor, err := parseFloatParameterNonNegative(pv, sc, fuseEphemeralStorageAllocatableFactorKey, fuseEphemeralStorageAllocatableFactorDefaultVal)
	if err != nil {
		return nil, fmt.Errorf("failed to parse fuse ephemeral storage allocatable factor param in StorageClass %q: %v", sc.Name, err)
	}

	// Parse volume attributes from the StorageClass parameters. Only select from keys recognized by the CSI Driver as volume attributes.
	volumeAttributes := selectFromMapIfKeysMatch(sc.Parameters, volumeAttributeKeys)

	return &scDetails{
		fileCacheMediumPriority:               fileCacheMediumPriority,
		fuseMemoryAllocatableFactor:           fuseMemoryAllocatableFactor,
		fuseEphemeralStorageAllocatableFactor: fuseEphemeralStorageAllocatableFactor,
		volumeAttributes:                      volumeAttributes,
		mountOptions:                          sc.MountOptions,
	}, nil
}

// selectFromMapIfKeysMatch returns a new map containing entries from the 'target' map
// only if their keys are also present in the 'keys' map. The values
// in the returned map are taken from the 'target' map.
func selectFromMapIfKeysMatch(target map[string]string, keys map[string]struct{}) map[string]string {
	result := make(map[string]string)
	keysCaseInsensitive := map[string]struct{}{}
	for key := range keys {
		keysCaseInsensitive[strings.ToLower(key)] = struct{}{}
	}

	for key, val := range target {
		if _, keyExists := keysCaseInsensitive[strings.ToLower(key)]; keyExists {
			result[key] = val
		}
	}
	return result
}

// isGpuNodeByResource checks if the node has allocatable nvidia.com/gpu resources.
func isGpuNodeByResource(node *corev1.Node) bool {
	if node == nil || node.Status.Allocatable == nil {
		return false
	}
	gpuQuantity, exists := node.Status.Allocatable[nvidiaGpuResourceName]
	return exists && gpuQuantity.CmpInt64(0) > 0
}

// isTpuNodeByResource checks if the node has allocatable google.com/tpu resources.
func isTpuNodeByResource(node *corev1.Node) bool {
	if node == nil || node.Status.Allocatable == nil {
		return false
	}
	tpuQuantity, exists := node.Status.Allocatable[googleTpuResourceName]
	return exists && tpuQuantity.CmpInt64(0) > 0
}

func hasLocalSSDEphemeralStorageAnnotation(annotations map[string]string) bool {
	// Get the value of the 'node.gke.io/last-applied-node-labels' annotation.
	appliedLabelsStr, ok := annotations[gkeAppliedNodeLabelsAnnotationKey]
	if !ok || appliedLabelsStr == "" {
		return false
	}
	// Split the comma-separated string of labels into individual label strings.
	labelPairs := strings.Split(appliedLabelsStr, ",")
	// Iterate through each label string (e.g., "key=value").
	for _, labelPairStr := range labelPairs {
		// Split the label string into key and value.
		// Use SplitN to handle cases where a value might unexpectedly contain an '='.
		kv := strings.SplitN(labelPairStr, "=", 2)
		if len(kv) != 2 {
			continue
		}
		labelKey := strings.TrimSpace(kv[0])
		labelValue := strings.TrimSpace(kv[1])
		// Check if this is the label we're looking for and if its value is "true".
		if labelKey == ephemeralStorageLocalSSDLabelKey && labelValue == util.TrueStr {
			return true
		}
	}
	// If we've gone through all labels and haven't found the specific key-value pair,
	// then the node does not have the indicator.
	return false
}

// parseResource attempts to parse a specific resource quantity (e.g., memory, ephemeral-storage)
// from a corev1.ResourceList. It returns the value in bytes as an int64.
// If the resource name is not found in the list, it defaults to 0.
// An error is returned if the quantity is present but cannot be parsed as an int64.
func parseResource(name corev1.ResourceName, resourceList corev1.ResourceList) (int64, error) {
	quantity, ok := resourceList[name]
	if !ok {
		// If the resource quantity is unset, default to zero (e.g. sidecar limits).
		klog.V(6).Infof("key %q not found in resource list %+v, defaulting to 0", name, resourceList)
		return 0, nil
	}
	bytes, parsedOK := quantity.AsInt64()
	if parsedOK {
		klog.V(6).Infof("Successfully parsed resource %q: %d bytes (%s)", name, bytes, quantity.String())
		return bytes, nil
	}
	return 0, fmt.Errorf("could not parse resource %q quantity %q as int64 bytes", name, quantity.String())
}

// parseResourceList parses memory and ephemeral storage resources from a
// corev1.ResourceList and returns them in a parsedResourceList struct.
// It uses parseResource internally for each resource type. An error is returned
// if any of the individual resource parsing fails.
func parseResourceList(resourceList corev1.ResourceList) (*parsedResourceList, error) {
	// Parse memory
	memory, err := parseResource(corev1.ResourceMemory, resourceList)
	if err != nil {
		return nil, fmt.Errorf("could not parse resource memory, err: %v", err)
	}

	// Parse ephemeral storage
	ephemeralStorage, err := parseResource(corev1.ResourceEphemeralStorage, resourceList)
	if err != nil {
		return nil, fmt.Errorf("could not parse resource ephemeral storage, err: %v", err)
	}

	return &parsedResourceList{
		memoryBytes:           memory,
		ephemeralStorageBytes: ephemeralStorage,
	}, nil
}

// minInt64 returns the smaller of two int64 values.
func minInt64(a, b int64) int64 {
	if a < b {
		return a
	}
	return b
}

// maxInt64 returns the larger of two int64 values.
func maxInt64(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

// bytesToMiB converts a byte count to mebibytes (MiB), rounding up to the nearest whole MiB.
func bytesToMiB(a int64) int64 {
	if a == -1 {
		return -1
	}
	return util.CeilDiv64(a, mib)
}

// mibToBytes converts mebibytes (MiB) to a byte count.
func mibToBytes(a int64) int64 {
	if a == -1 {
		return -1
	}
	return a * mib
}

// isValidMountOption checks if a mount option string follows the allowed formats.
// An option is valid unless it meets one of the following prohibited conditions:
//  1. It is empty.
//  2. It starts/ends with a colon (e.g., ":a", "a:").
//  3. It starts/ends with an equal sign (e.g., "=a", "a=").
//  4. It contains more than one equals sign (e.g., "a=b=c").
func isValidMountOption(opt string) bool {
	if opt == "" {
		return false
	}

	if strings.HasPrefix(opt, ":") || strings.HasSuffix(opt, ":") {
		return false // Prohibited: Starts with ":" or ends with ":"
	}

	if strings.HasPrefix(opt, "=") || strings.HasSuffix(opt, "=") {
		return false // Prohibited: Starts with "=" or ends with "="
	}

	if strings.Count(opt, "=") > 1 {
		return false // Prohibited: Multiple '=' signs
	}

	// If none of the invalid conditions are met, the option is valid.
	return true
}

// getMountOptionKey extracts the key part of a mount option string.
// This function assumes the input `opt` has already been validated by isValidMountOption.
// Formats supported and precedence:
// 1. key=value  (Key is everything before the first '=')
// 2. ...:key:value (Key is everything before the last ':')
// 3. key        (Key is the entire string)
func getMountOptionKey(opt string) (string, string) {
	if strings.Contains(opt, "=") {
		// isValidMountOption ensures at most one '=', so SplitN is safe.
		parts := strings.SplitN(opt, "=", 2)
		return parts[0], parts[1]
	}
	if strings.Contains(opt, ":") {
		lastColon := strings.LastIndex(opt, ":")
		// isValidMountOption ensures it doesn't start with ':', so lastColon > 0 if ':' exists.
		return opt[:lastColon], opt[lastColon+1:]
	}
	// No '=' or ':', the entire valid string is the key.
	return opt, ""
}

func (config *ProfileConfig) parseCacheOverrides(mountOptions []string) (*cacheOverrides, error) {
	cacheOverrides := cacheOverrides{}

	assignOverride := func(target **int64, str string) error {
		if str == "" {
			return nil
		}
		val, err := strconv.ParseInt(str, 10, 64)
		if err != nil {
			return err
		}
		newVal := mibToBytes(val)
		*target = &newVal
		return nil
	}

	for _, opt := range mountOptions {
		key, val := getMountOptionKey(opt)
		switch strings.ToLower(key) {
		// The mapping is hardcoded because there does not exist a programatic way
		// of normalizing the keys, due to grouping inconsistencies.
		case statCacheConfigFileKey, statCacheCLIKey:
			if err := assignOverride(&cacheOverrides.metadataStatCacheBytes, val); err != nil {
				return nil, fmt.Errorf("failed to override mount option %q for recommendation: %w", opt, err)
			}
		case fileCacheConfigFileKey, fileCacheCLIKey:
			if err := assignOverride(&cacheOverrides.fileCacheBytes, val); err != nil {
				return nil, fmt.Errorf("failed to override mount option %q for recommendation: %w", opt, err)
			}
		}
	}

	return &cacheOverrides, nil
}

// mergeMountOptionsOnMissingKeys merges mount options from systemOpts into userOpts.
// It returns an error if any option in userOpts or systemOpts is invalid.
// An option from systemOpts is added only if the key is not already
// present in the keys of options within userOpts.
//
// Note: Complete deduplication is impossible, since there doesn't exist
// any consistent mapping between gcsfuse config-file groups and CLI options.
// In the rare scenario that this happens, the user's CLI option will
// take precedence by the gcsfuse process hierarchy downstream. The CSI recommender
// should always ensure to only recommend config-file to respect this behavior.
func mergeMountOptionsOnMissingKeys(userOpts, systemOpts []string) ([]string, error) {
	var mountOptions []string
	existingKeys := make(map[string]bool)

	normalizeOpt := func(opt string) string {
		switch strings.ToLower(opt) {
		// The mapping is hardcoded because there does not exist a programatic way
		// of normalizing the keys, due to grouping inconsistencies.
		case statCacheCLIKey:
			return statCacheConfigFileKey
		case fileCacheCLIKey:
			return fileCacheConfigFileKey
		}
		return strings.ToLower(opt)
	}

	// Validate and collect options from userOpts.
	for _, opt := range userOpts {
		if !isValidMountOption(opt) {
			return nil, fmt.Errorf("invalid mount option in userOpts: %q", opt)
		}
		mountOptions = append(mountOptions, opt)
		key, _ := getMountOptionKey(opt)
		existingKeys[normalizeOpt(key)] = true
	}

	if len(systemOpts) == 0 {
		return mountOptions, nil
	}

	// Validate and process systemOpts, adding only valid options with new normalized keys.
	for _, opt := range systemOpts {
		if !isValidMountOption(opt) {
			return nil, fmt.Errorf("invalid mount option in systemOpts: %q", opt)
		}

		key, _ := getMountOptionKey(opt)
		key = normalizeOpt(key)
		if !existingKeys[key] {
			mountOptions = append(mountOptions, opt)
			existingKeys[key] = true
		}
	}
	return mountOptions, nil
}

// mergeMapsOnMissingKeys merges key/value pairs from src into dst.
// A key/value pair from src is added to dst only if the key
// does NOT already exist in dst.
func mergeMapsOnMissingKeys(dst, src map[string]string) map[string]string {
	if dst == nil {
		return src
	}
	if src == nil {
		return dst
	}
	result := map[string]string{}
	caseInsensitiveDstKeys := map[string]struct{}{}
	for k, v := range dst {
		result[k] = v
		caseInsensitiveDstKeys[strings.ToLower(k)] = struct{}{}
	}
	// Check if the case-insensitive keys match before adding the source key/val pair to the destination map.
	for key, value := range src {
		caseInsensitiveSrcKey := strings.ToLower(key)
		if _, exists := caseInsensitiveDstKeys[caseInsensitiveSrcKey]; !exists {
			result[key] = value
			caseInsensitiveDstKeys[caseInsensitiveSrcKey] = struct{}{}
		}
	}
	return result
}
