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

package webhook

import (
	"path/filepath"

	"github.com/googlecloudplatform/gcs-fuse-csi-driver/pkg/util"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

const (
	GcsFuseSidecarName                                   = "gke-gcsfuse-sidecar"
	MetadataPrefetchSidecarName                          = "gke-gcsfuse-metadata-prefetch"
	SidecarContainerTmpVolumeMountPath                   = "/gcsfuse-tmp"
	SidecarContainerBufferVolumeName                     = "gke-gcsfuse-buffer"
	SidecarContainerBufferVolumeMountPath                = "/gcsfuse-buffer"
	SidecarContainerCacheVolumeName                      = "gke-gcsfuse-cache"
	SidecarContainerCacheVolumeMountPath                 = "/gcsfuse-cache"
	SidecarContainerSATokenVolumeName                    = "gcsfuse-sa-token"            // #nosec G101
	SidecarContainerSATokenVolumeMountPath               = "/gcsfuse-sa-token"           // #nosec G101
	K8STokenPath                                         = "token"                       // #nosec G101
	SidecarContainerWITokenVolumeName                    = "gke-workload-identity-token" // Mount path for this volume should be read from the workload identity credential configuration configmap. Typically the mounth path is /var/run/service-account.
	SidecarContainerWICredentialConfigMapVolumeName      = "gke-workload-identity-credential-configmap"
	SidecarContainerWICredentialConfigMapVolumeMountPath = "/etc/workload-identity"

	// Webhook relevant volume attributes.
	gcsFuseMetadataPrefetchOnMountVolumeAttribute = "gcsfuseMetadataPrefetchOnMount"
	SharedMountVolumeAttribute                    = "sharedMount"

	// Webhook relevant labels and annotations.
	SharedMountLabel             = "gke-gcsfuse/shared-mount"
	MounterPodTemplateAnnotation = "gke-gcsfuse/mounter-pod-template"

	// gcsfuse profiles constants
	GcsfuseProfilesManagedLabel                           = "gke-gcsfuse/profile-managed"
	GcsfuseCacheCreatedByUserLabel                        = "gke-gcsfuse/cache-created-by-user"
	BucketScanPendingSchedulingGate                       = "gke-gcsfuse/bucket-scan-pending"
	SidecarContainerFileCacheEphemeralDiskVolumeName      = "gcsfuse-file-cache-ephemeral-disk"
	SidecarContainerFileCacheEphemeralDiskVolumeMountPath = "/gcsfuse-file-cache-ephemeral-disk"
	SidecarContainerFileCacheRamDiskVolumeName            = "gcsfuse-file-cache-ram-disk"
	SidecarContainerFileCacheRamDiskVolumeMountPath       = "/gcsfuse-file-cache-ram-disk"

	// See the nonroot user discussion: https://github.com/GoogleContainerTools/distroless/issues/443
	NobodyUID           = 65534
	NobodyGID           = 65534
	tokenExpiryDuration = 3600
)

var (
	// gke-gcsfuse-sidecar volumes.
	tmpVolume = corev1.Volume{
		Name: util.SidecarContainerTmpVolumeName,
		VolumeSource: corev1.VolumeSource{
			EmptyDir: &corev1.EmptyDirVolumeSource{},
		},
	}

	buffVolume = corev1.Volume{
		Name: SidecarContainerBufferVolumeName,
		VolumeSource: corev1.VolumeSource{
			EmptyDir: &corev1.EmptyDirVolumeSource{},
		},
	}

	cacheVolume = corev1.Volume{
		Name: SidecarContainerCacheVolumeName,
		VolumeSource: corev1.VolumeSource{
			EmptyDir: &corev1.EmptyDirVolumeSource{},
		},
	}

	// gke-gcsfuse-sidecar volumeMounts.
	TmpVolumeMount = corev1.VolumeMount{
		Name:      util.SidecarContainerTmpVolumeName,
		MountPath: SidecarContainerTmpVolumeMountPath,
	}

	buffVolumeMount = corev1.VolumeMount{
		Name:      SidecarContainerBufferVolumeName,
		MountPath: SidecarContainerBufferVolumeMountPath,
	}

	cacheVolumeMount = corev1.VolumeMount{
		Name:      SidecarContainerCacheVolumeName,
		MountPath: SidecarContainerCacheVolumeMountPath,
	}

	SATokenVolumeMount = corev1.VolumeMount{
		Name:      SidecarContainerSATokenVolumeName,
		MountPath: SidecarContainerSATokenVolumeMountPath,
	}

	// gcsfuse profiles related vars.
	EphemeralFileCacheVolume = corev1.Volume{
		Name:         SidecarContainerFileCacheEphemeralDiskVolumeName,
		VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}},
	}

	RamFileCacheVolume = corev1.Volume{
		Name: SidecarContainerFileCacheRamDiskVolumeName,
		VolumeSource: corev1.VolumeSource{
			EmptyDir: &corev1.EmptyDirVolumeSource{
				Medium: corev1.StorageMediumMemory,
			},
		},
	}

	RamFileCacheVolumeMount = corev1.VolumeMount{
		Name:      SidecarContainerFileCacheRamDiskVolumeName,
		MountPath: SidecarContainerFileCacheRamDiskVolumeMountPath,
	}

	EphemeralFileCacheVolumeMount = corev1.VolumeMount{
		Name:      SidecarContainerFileCacheEphemeralDiskVolumeName,
		MountPath: SidecarContainerFileCacheEphemeralDiskVolumeMountPath,
	}
)

type SidecarContainerCredentialConfiguration struct {
	GacEnv                 *corev1.EnvVar       // This is the environment variable for GOOGLE_APPLICATION_CREDENTIALS that will be injected into the sidecar container.
	CredentialVolumeMounts []corev1.VolumeMount // These are the volume mounts for the credential files that will be injected into the sidecar container.
	EnvVars                []corev1.EnvVar      // These are generic environment variables that will be injected into the sidecar container.
}

func GetNativeSidecarContainerSpec(c *Config, credentialConfig *SidecarContainerCredentialConfiguration) corev1.Container {
	container := GetSidecarContainerSpec(c, credentialConfig)
	container.Env = append(container.Env, corev1.EnvVar{Name: "NATIVE_SIDECAR", Value: "TRUE"})
	container.RestartPolicy = ptr.To(corev1.ContainerRestartPolicyAlways)

	return container
}

func GetSidecarContainerSpec(c *Config, credentialConfig *SidecarContainerCredentialConfiguration) corev1.Container {
	limits, requests := prepareResourceList(c)

	volumeMounts := []corev1.VolumeMount{TmpVolumeMount, buffVolumeMount, cacheVolumeMount}
	// Inject SA token only for Host Network pods
	if c.PodHostNetworkSetting && c.ShouldInjectSAVolume {
		volumeMounts = append(volumeMounts, SATokenVolumeMount)
	}

	container := corev1.Container{
		Name:            GcsFuseSidecarName,
		Image:           c.ContainerImage,
		ImagePullPolicy: corev1.PullPolicy(c.ImagePullPolicy),
		SecurityContext: GetSecurityContext(c),
		Args: []string{
			"--v=5",
		},
		Resources: corev1.ResourceRequirements{
			Limits:   limits,
			Requests: requests,
		},
		VolumeMounts: volumeMounts,
	}

	// Inject the environment variable and volume mounts for the credential files.
	if credentialConfig != nil {
		// Inject the environment variable for GOOGLE_APPLICATION_CREDENTIALS.
		if credentialConfig.GacEnv != nil {
			container.Env = append(container.Env, *credentialConfig.GacEnv)
		}

		// Inject generic environment variables.
		if len(credentialConfig.EnvVars) > 0 {
			container.Env = append(container.Env, credentialConfig.EnvVars...)
		}
		// Inject the volume mounts for the credential files.
		if len(credentialConfig.CredentialVolumeMounts) > 0 {
			container.VolumeMounts = append(container.VolumeMounts, credentialConfig.CredentialVolumeMounts...)
		}
	}

	return container
}

// GetSecurityContext ensures the sidecar that uses it follows Restricted Pod Security Standard,
// when appropriate. See
// https://kubernetes.io/docs/concepts/security/pod-security-standards/#restricted.
// It is not always possible, eg if the workload needs to have a NUMA-pinned GCS Fuse instance.
func GetSecurityContext(c *Config) *corev1.SecurityContext {
	securityContext := &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptr.To(false),
		ReadOnlyRootFilesystem:   ptr.To(true),
		Capabilities: &corev1.Capabilities{
			Drop: []corev1.Capability{
				corev1.Capability("ALL"),
			},
		},
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		RunAsNonRoot:   ptr.To(true),
		RunAsUser:      ptr.To(int64(NobodyUID)),
		RunAsGroup:     ptr.To(int64(NobodyGID)),
	}

	if c.EnableNumaPinning {
		securityContext.SeccompProfile.Type = corev1.SeccompProfileTypeUnconfined
		securityContext.Capabilities.Add = append(securityContext.Capabilities.Add, corev1.Capability("CAP_SYS_NICE"))
	}
	return securityContext
}

func (si *SidecarInjector) GetMetadataPrefetchSidecarContainerSpec(pod *corev1.Pod, c *Config) corev1.Container {
	if pod == nil {
		klog.Warning("failed to get metadata prefetch container spec: pod is nil")

		return corev1.Container{}
	}
	limits, requests := prepareResourceList(c)

	// The sidecar container follows Restricted Pod Security Standard,
	// see https://kubernetes.io/docs/concepts/security/pod-security-standards/#restricted
	container := corev1.Container{
		Name:            MetadataPrefetchSidecarName,
		Image:           c.ContainerImage,
		ImagePullPolicy: corev1.PullPolicy(c.ImagePullPolicy),
		SecurityContext: GetSecurityContext(c),
		Resources: corev1.ResourceRequirements{
			Limits:   limits,
			Requests: requests,
		},
		VolumeMounts: []corev1.VolumeMount{},
	}

	for _, v := range pod.Spec.Volumes {
		isGcsFuseCSIVolume, isDynamicMount, volumeAttributes, _, err := si.isGcsFuseCSIVolume(v, pod.Namespace)
		if err != nil {
			klog.Errorf("failed to determine if %s is a GcsFuseCSI backed volume: %v", v.Name, err)
		}

		if isDynamicMount {
			klog.Warningf("dynamic mount set for %s, this is not supported for metadata prefetch. skipping volume", v.Name)
			continue
		}

		if !isGcsFuseCSIVolume {
			continue
		}

		// We disable metadata prefetch by default, so we skip injection of volume mount when not set.
		if enableMetaPrefetchRaw, ok := volumeAttributes[gcsFuseMetadataPrefetchOnMountVolumeAttribute]; ok {
			parseMetadataPrefetchStringAndAppendVolume(enableMetaPrefetchRaw, &container, v.Name)
			continue
		}

		// If using gcsfuse profiles, check the StorageClass as fallback.
		if !c.EnableGcsfuseProfiles {
			continue

		}
		sc, err := si.profileStorageClass(pod.Namespace, v)

		if err != nil {
			klog.Errorf("failed to get storage class for profiles feature for volume %q: %v", v.Name, err)
			continue
		}

		if sc == nil {
			continue
		}

		if enableMetaPrefetchRaw, ok := sc.Parameters[gcsFuseMetadataPrefetchOnMountVolumeAttribute]; ok {
			parseMetadataPrefetchStringAndAppendVolume(enableMetaPrefetchRaw, &container, v.Name)
		}
	}

	return container
}

func parseMetadataPrefetchStringAndAppendVolume(enableMetaPrefetchRaw string, container *corev1.Container, volumeName string) {
	enableMetaPrefetch, err := ParseBool(enableMetaPrefetchRaw)
	if err != nil {
		klog.Errorf("failed to determine value of %q for volume %q: %v", gcsFuseMetadataPrefetchOnMountVolumeAttribute, volumeName, err)
	}

	if enableMetaPrefetch {
		container.VolumeMounts = append(container.VolumeMounts, corev1.VolumeMount{Name: volumeName, MountPath: filepath.Join("/volumes/", volumeName), ReadOnly: true})
	}
}

func GetSATokenVolume(audience string) corev1.Volume {
	saTokenVolume := corev1.Volume{
		Name: SidecarContainerSATokenVolumeName,
		VolumeSource: corev1.VolumeSource{
			Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{
					{
						ServiceAccountToken: &corev1.ServiceAccountTokenProjection{
							Audience:          audience,
							ExpirationSeconds: &[]int64{tokenExpiryDuration}[0],
							Path:              K8STokenPath,
						},
					},
				},
			},
		},
	}

	return saTokenVolume
}

// GetSidecarContainerVolumeSpec returns volumes required by the sidecar container,
// skipping the existing custom volumes.
func GetSidecarContainerVolumeSpec(existingVolumes ...corev1.Volume) []corev1.Volume {
	volumes := []corev1.Volume{tmpVolume}
	var bufferVolumeExists, cacheVolumeExists bool

	for _, v := range existingVolumes {
		switch v.Name {
		case SidecarContainerBufferVolumeName:
			bufferVolumeExists = true
		case SidecarContainerCacheVolumeName:
			cacheVolumeExists = true
		}
	}

	if !bufferVolumeExists {
		volumes = append(volumes, buffVolume)
	}

	if !cacheVolumeExists {
		volumes = append(volumes, cacheVolume)
	}

	return volumes
}

// ValidatePodHasSidecarContainerInjected validates the following:
//  1. One of the container or init container name matches the sidecar container name.
//  2. The container uses NobodyUID and NobodyGID.
//  3. The container uses the temp volume.
//  4. The temp volume have correct volume mount paths.
//  5. The Pod has the temp volume and the volume is an emptyDir volumes.
//
// Returns two booleans:
//  1. True when either native or regular sidecar is present.
//  2. True iff the sidecar present is a native sidecar container.
func ValidatePodHasSidecarContainerInjected(pod *corev1.Pod) (bool, bool) {
	return validatePodHasSidecarContainerInjected(GcsFuseSidecarName, pod, []corev1.Volume{tmpVolume}, []corev1.VolumeMount{TmpVolumeMount})
}

func sidecarContainerPresent(containerName string, containers []corev1.Container, volumeMounts []corev1.VolumeMount) bool {
	containerInjected := false
	volumeMountMap := map[string]string{}
	for _, vm := range volumeMounts {
		volumeMountMap[vm.Name] = vm.MountPath
	}

	for _, c := range containers {
		if c.Name == containerName {
			if c.SecurityContext != nil &&
				c.SecurityContext.RunAsUser != nil &&
				c.SecurityContext.RunAsGroup != nil &&
				*c.SecurityContext.RunAsUser == NobodyUID &&
				*c.SecurityContext.RunAsGroup == NobodyGID {
				containerInjected = true
			}
			// Delete volumeMounts present from map.
			for _, vm := range c.VolumeMounts {
				if mountPath, exists := volumeMountMap[vm.Name]; exists {
					if vm.MountPath == mountPath {
						delete(volumeMountMap, vm.Name)
					}
				}
			}

			break
		}
	}

	if containerInjected && len(volumeMountMap) == 0 {
		return true
	}

	return false
}

func validatePodHasSidecarContainerInjected(containerName string, pod *corev1.Pod, volumes []corev1.Volume, volumeMounts []corev1.VolumeMount) (bool, bool) {
	// Checks that the default emptyDir volumes are present in pod, skipping the custom volumes.
	volumesInjected := func(pod *corev1.Pod) bool {
		volumeMap := map[string]corev1.EmptyDirVolumeSource{}
		for _, v := range volumes {
			volumeMap[v.Name] = *v.EmptyDir
		}

		// volumeMap/volumes represents all of the volumes that should be present in the pod.
		for _, v := range pod.Spec.Volumes {
			if _, exists := volumeMap[v.Name]; exists {
				if v.EmptyDir != nil {
					delete(volumeMap, v.Name)
				}
			}
		}

		return len(volumeMap) == 0
	}

	// Check the sidecar container is present in regular or init container list.
	containerAndVolumeMountPresentInContainers := sidecarContainerPresent(containerName, pod.Spec.Containers, volumeMounts)
	containerAndVolumeMountPresentInInitContainers := sidecarContainerPresent(containerName, pod.Spec.InitContainers, volumeMounts)

	if containerAndVolumeMountPresentInContainers && containerAndVolumeMountPresentInInitContainers {
		klog.Errorf("sidecar present in containers and init containers... make sure only one sidecar is present.")
	}

	if !containerAndVolumeMountPresentInContainers && !containerAndVolumeMountPresentInInitContainers {
		return false, false
	}

	// We continue validation if all sidecar volumes are present in the pod.
	if !volumesInjected(pod) {
		return false, false
	}

	return true, containerAndVolumeMountPresentInInitContainers
}
