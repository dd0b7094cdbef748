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
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"cloud.google.com/go/profiler"
	driver "github.com/googlecloudplatform/gcs-fuse-csi-driver/pkg/csi_driver"
	"github.com/googlecloudplatform/gcs-fuse-csi-driver/pkg/util"
	"github.com/googlecloudplatform/gcs-fuse-csi-driver/pkg/webhook"
	"gopkg.in/yaml.v3"
	"k8s.io/klog/v2"
)

const (
	GCSFuseAppName             = "gke-gcs-fuse-csi"
	TempDir                    = "/temp-dir"
	unixSocketBasePath         = "unix://"
	TokenFileName              = "token.sock" // #nosec G101
	KernelParamsFileConfigFlag = "file-system:kernel-params-file"
)

// MountConfig contains the information gcsfuse needs.
type MountConfig struct {
	FileDescriptor                 int                   `json:"-"`
	VolumeName                     string                `json:"volumeName,omitempty"`
	BucketName                     string                `json:"bucketName,omitempty"`
	BufferDir                      string                `json:"-"`
	CacheDir                       string                `json:"-"`
	TempDir                        string                `json:"-"`
	ConfigFile                     string                `json:"-"`
	Options                        []string              `json:"options,omitempty"`
	ErrWriter                      stderrWriterInterface `json:"-"`
	FlagMap                        map[string]string     `json:"-"`
	ConfigFileFlagMap              map[string]string     `json:"-"`
	TokenServerIdentityProvider    string                `json:"-"`
	HostNetworkKSAOptIn            bool                  `json:"-"`
	EnableGCSFuseKernelParams      bool                  `json:"-"`
	EnableCloudProfilerForSidecar  bool                  `json:"-"`
	PodNamespace                   string                `json:"-"`
	ServiceAccountName             string                `json:"-"`
	PodName                        string                `json:"-"`
	PodUID                         string                `json:"-"`
	EnableSidecarBucketAccessCheck bool                  `json:"-"`
	TokenServerIdentityPool        string                `json:"-"`
	SidecarRetryConfig             sidecarRetryConfig    `json:"-"`
	FileCacheMedium                string                `json:"-"`
	GcsFuseNumaNode                int                   `json:"-"`
	CustomEndpoint                 string                `json:"-"`
	EnableAutoGoMemLimit           bool                  `json:"-"`
	AutoGoMemLimitRatio            float64               `json:"-"`
	StorageEndpoint                string                `json:"-"`
	SharedMountPoint               string                `json:"-"`
}

// EnsureErrWriter safely initializes ErrWriter to the correct writer if it is nil.
func (mc *MountConfig) EnsureErrWriter() {
	if mc == nil {
		return
	}
	if mc.ErrWriter != nil {
		return
	}
	if mc.TempDir != "" {
		mc.ErrWriter = NewErrorWriter(filepath.Join(mc.TempDir, util.ErrorFileName))
		klog.V(4).Infof("Initialized ErrWriter for volume %q", mc.VolumeName)
		return
	}
	klog.Warningf("ErrWriter initialization failed for volume %q, creating a no-op error writer", mc.VolumeName)
	mc.ErrWriter = NewErrorWriter("")
}

// sidecarRetryConfig controls the retry configurations for sidecarRetry behavior for storage service creation and bucket access check.
type sidecarRetryConfig struct {
	Duration time.Duration
	Factor   float64
	Cap      time.Duration
	Steps    int
	Jitter   float64
}

var (
	prometheusPort    = 62990
	startProfilerOnce sync.Once
)

// DisallowedFlags is a map of flags that are disallowed to be passed to sidecar mounter directly.
// They are mapped to their config file style representation so that they can be passed in config file format
// as a workaround to bypass the disallowed flags validation.
// Note: If you add a new disallowed flag here that is needed for integration testing,
// you should also update the ParseConfigFlags() logic in test/e2e/utils/utils.go to handle it.
var DisallowedFlags = map[string]string{
	// The following flags are explicitly handled in test/e2e/utils/utils.go
	"log-file":   "logging:file-path",
	"log-format": "logging:format",
	"o":          "o",
	"cache-dir":  "cache-dir",

	// --- Unused in test/e2e/utils/utils.go ---
	"temp-dir":                 "temp-dir",
	"config-file":              "config-file",
	"foreground":               "foreground",
	"key-file":                 "gcs-auth:key-file",
	"token-url":                "gcs-auth:token-url",
	"reuse-token-from-url":     "gcs-auth:reuse-token-from-url",
	"prometheus-port":          "prometheus-port",
	"kernel-params-file":       "file-system:kernel-params-file",
	KernelParamsFileConfigFlag: KernelParamsFileConfigFlag,
}

// Fetch the following information from a given socket path:
// 1. Pod volume name
// 2. The file descriptor
// 3. GCS bucket name
// 4. Mount options passing to gcsfuse (passed by the csi mounter).
func NewMountConfig(sp string, flagMapFromDriver map[string]string) *MountConfig {
	// socket path pattern: /gcsfuse-tmp/.volumes/<volume-name>/socket
	tempDir := filepath.Dir(sp)
	volumeName := filepath.Base(tempDir)
	mc := MountConfig{
		VolumeName:          volumeName,
		BufferDir:           filepath.Join(webhook.SidecarContainerBufferVolumeMountPath, ".volumes", volumeName),
		CacheDir:            filepath.Join(webhook.SidecarContainerCacheVolumeMountPath, ".volumes", volumeName),
		TempDir:             tempDir,
		ConfigFile:          filepath.Join(webhook.SidecarContainerTmpVolumeMountPath, ".volumes", volumeName, "config.yaml"),
		ErrWriter:           NewErrorWriter(filepath.Join(tempDir, util.ErrorFileName)),
		AutoGoMemLimitRatio: util.GoMemLimitCgroupPercentage,
	}

	klog.Infof("connecting to socket %q", sp)
	c, err := net.Dial("unix", sp)
	if err != nil {
		mc.ErrWriter.WriteMsg(fmt.Sprintf("failed to connect to the socket %q: %v", sp, err))

		return nil
	}

	fd, msg, err := util.RecvMsg(c)
	if err != nil {
		mc.ErrWriter.WriteMsg(fmt.Sprintf("failed to receive mount options from the socket %q: %v", sp, err))

		return nil
	}
	// as we got all the information from the socket, closing the connection and deleting the socket
	c.Close()
	if err = syscall.Unlink(sp); err != nil && err != syscall.ENOENT {
		// ENOENT suggests, the file may have already been unliked and removed, since the listener is closed on the csi node driver when it has successfully responsed to the sidecar
		klog.Errorf("failed to unlink socket %q: %v", sp, err)
	}

	mc.FileDescriptor = fd

	if err := json.Unmarshal(msg, &mc); err != nil {
		mc.ErrWriter.WriteMsg(fmt.Sprintf("failed to unmarshal the mount config: %v", err))

		return nil
	}

	if mc.BucketName == "" {
		mc.ErrWriter.WriteMsg("failed to fetch bucket name from CSI driver")

		return nil
	}

	mc.prepareMountArgs()
	mergeFlags(mc.ConfigFileFlagMap, flagMapFromDriver)
	if err := mc.prepareConfigFile(); err != nil {
		mc.ErrWriter.WriteMsg(fmt.Sprintf("failed to create config file %q: %v", mc.ConfigFile, err))

		return nil
	}

	return &mc
}

func mergeFlags(mountConfigFlagMap map[string]string, driverFlagMap map[string]string) {
	for key, value := range driverFlagMap {
		_, ok := mountConfigFlagMap[key]
		// Only overwrite values not set in mountConfigMap
		if !ok {
			mountConfigFlagMap[key] = value
		}
	}
}

// ReadDriverFlagsForDefaulting reads the defaulting flags file written by the CSI driver
// into the emptyDir volume and parses its content into a map of flag key-value pairs.
// If the file does not exist, it returns an empty map and nil error.
func ReadDriverFlagsForDefaulting(defaultFilePath string) (map[string]string, error) {
	machineTypeBytes, err := os.ReadFile(defaultFilePath)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return map[string]string{}, nil
		}
		return nil, fmt.Errorf("failed to read defaulting-flag file %q: %w", defaultFilePath, err)
	}
	return driver.ParseFlagMapFromFlagFile(string(machineTypeBytes)), nil
}

func (mc *MountConfig) prepareMountArgs() {
	flagMap := map[string]string{
		"app-name":        GCSFuseAppName,
		"temp-dir":        mc.BufferDir + TempDir,
		"config-file":     mc.ConfigFile,
		"foreground":      "",
		"uid":             "0",
		"gid":             "0",
		"prometheus-port": strconv.Itoa(prometheusPort),
	}
	// Use a new port each gcsfuse instance that we start.
	prometheusPort++

	configFileFlagMap := map[string]string{
		"logging:file-path": "/dev/fd/1", // redirect the output to cmd stdout
		"logging:format":    "json",
		"cache-dir":         "", // by default the gcsfuse file cache is disabled on GKE
	}

	invalidArgs := []string{}

	mc.GcsFuseNumaNode = -1
	for _, arg := range mc.Options {
		klog.Infof("processing mount arg %v", arg)

		// Config file flags are identified by not containing '=' and containing ':'.
		// e.g., "logging:severity:error"
		if !strings.Contains(arg, "=") && strings.Contains(arg, ":") && !strings.Contains(arg, "https") {
			var f, v string
			if strings.HasPrefix(arg, "gcs-connection:custom-endpoint:") {
				parts := strings.SplitN(arg, ":", 3)
				f = parts[0] + ":" + parts[1]
				v = parts[2]
			} else {
				i := strings.LastIndex(arg, ":")
				f, v = arg[:i], arg[i+1:]
			}
			if f == util.DisableMetricsForGKE {
				if v == util.TrueStr {
					flagMap["prometheus-port"] = "0"
				}

				continue
			}

			if _, ok := DisallowedFlags[f]; ok {
				invalidArgs = append(invalidArgs, arg)
			} else {
				configFileFlagMap[f] = v
			}

			// if the value of flag file-cache:max-size-mb is not 0,
			// enable the file cache feature by passing the cache directory.
			if f == "file-cache:max-size-mb" && v != "0" {
				configFileFlagMap["cache-dir"] = mc.CacheDir
			}

			continue
		}

		argPair := strings.SplitN(arg, "=", 2)
		if len(argPair) == 0 {
			continue
		}

		flag := argPair[0]
		if _, ok := DisallowedFlags[flag]; ok {
			// Reject all disallowed flags EXCEPT "-o" when SharedMountPoint is set.
			// SharedMountPoint is set when the shared mount feature is enabled, during which the "-o" flag is needed to pass mount options to gcsfuse.
			isAllowedOFlag := flag == "o" && mc.SharedMountPoint != ""
			if !isAllowedOFlag {
				invalidArgs = append(invalidArgs, arg)
				continue
			}
		}

		value := ""
		if len(argPair) > 1 {
			value = argPair[1]
		}

		switch flag {
		case util.TokenServerIdentityProviderConst:
			mc.TokenServerIdentityProvider = value
			continue

		case util.TokenServerIdentityPoolConst:
			mc.TokenServerIdentityPool = value
			continue

		case util.OptInHnw:
			mc.HostNetworkKSAOptIn = value == util.TrueStr
			continue

		case util.EnableSidecarBucketAccessCheckConst:
			mc.EnableSidecarBucketAccessCheck = value == util.TrueStr
			continue

		case util.PodNamespaceConst:
			mc.PodNamespace = value
			continue

		case util.ServiceAccountNameConst:
			mc.ServiceAccountName = value
			continue

		case util.PodNameConst:
			mc.PodName = value
			continue

		case util.PodUIDConst:
			mc.PodUID = value
			continue

		case util.EnableCloudProfilerForSidecarConst:
			mc.EnableCloudProfilerForSidecar = value == util.TrueStr
			continue

		case util.FileCacheMediumConst:
			mc.FileCacheMedium = value
			continue

		case util.GCSFuseNumaNodeArg:
			idx, err := strconv.Atoi(value)
			if err != nil {
				invalidArgs = append(invalidArgs, arg)
			} else {
				mc.GcsFuseNumaNode = idx
			}
			continue

		case util.EnableGCSFuseKernelParams:
			mc.EnableGCSFuseKernelParams = value == util.TrueStr
			continue

		case util.EnableAutoGoMemLimitConst:
			mc.EnableAutoGoMemLimit = value == util.TrueStr
			continue

		case util.AutoGoMemLimitRatioConst:
			ratio, err := strconv.ParseFloat(value, 64)
			if err != nil || ratio <= 0 || ratio > 1 {
				invalidArgs = append(invalidArgs, arg)
			} else {
				mc.AutoGoMemLimitRatio = ratio
			}
			continue

		case util.StorageEndpointInternal:
			mc.StorageEndpoint = value
			continue
		}

		if flag == util.GCSFuseAppNameArg {
			value = GCSFuseAppName + "-" + value
		}

		// The "-o" flag can be passed multiple times, and gcsfuse expects them to be comma-separated.
		if flag == "o" {
			if value != "" {
				if existing, ok := flagMap["o"]; ok && existing != "" {
					flagMap["o"] = existing + "," + value
				} else {
					flagMap["o"] = value
				}
			}
		} else {
			flagMap[flag] = value
		}
	}

	if len(invalidArgs) > 0 {
		klog.Warningf("got invalid arguments for volume %q: %v. Will discard invalid args and continue to mount.",
			invalidArgs, mc.VolumeName)
	}

	// This flag can only be passed by the CSI driver if the following two things are true:
	//   1. User is using the gcsfuse profiles feature.
	//   2. User did not create a custom cache: https://cloud.google.com/kubernetes-engine/docs/how-to/cloud-storage-fuse-csi-driver-sidecar#configure-custom-read-cache-volume
	// This allows customers to override the caching medium while using the profiles feature, if they wish.
	if mc.FileCacheMedium != "" {
		cacheDir := ""
		switch mc.FileCacheMedium {
		case util.MediumRAM:
			cacheDir = webhook.SidecarContainerFileCacheRamDiskVolumeMountPath
		case util.MediumLSSD:
			cacheDir = webhook.SidecarContainerFileCacheEphemeralDiskVolumeMountPath
		default:
			klog.Warningf("got invalid value for %q: %q. Will discard and continue to mount.", util.FileCacheMediumConst, mc.FileCacheMedium)
		}

		isSidecarMounted := mc.SharedMountPoint == ""
		// Ensure a unique directory is passed for each volume for sidecar architecture.
		if isSidecarMounted {
			cacheDir = filepath.Join(cacheDir, ".volumes", mc.VolumeName)
		}

		configFileFlagMap["cache-dir"] = cacheDir
		mc.CacheDir = cacheDir
		klog.Infof("Overriding cache-dir with %q for medium %q", cacheDir, mc.FileCacheMedium)
	}

	if mc.EnableGCSFuseKernelParams {
		// This kernel params config file is created by GCSFuse only.
		configFileFlagMap[KernelParamsFileConfigFlag] = filepath.Join(mc.TempDir, util.GCSFuseKernelParamsFileName)
	}

	if mc.EnableCloudProfilerForSidecar {
		enableProfiler := true
		val, ok := flagMap[util.EnableCloudProfilerConst]
		if ok {
			if parsed, err := strconv.ParseBool(val); err == nil && !parsed {
				enableProfiler = false
			}
		}

		if enableProfiler {
			// Inject Cloud Profiler flags supported by gcsfuse.
			flagMap[util.EnableCloudProfilerConst] = ""
			customLabel := util.GetCloudProfilerServiceVersion(mc.PodName, mc.PodUID)
			flagMap["cloud-profiler-label"] = customLabel
			klog.Infof("Setting label in GCSFuse mount options: %q", customLabel)
		} else {
			klog.Infof("Cloud Profiler for GCSFuse is disabled via mount options: %s=%s", util.EnableCloudProfilerConst, val)
		}
	}

	mc.FlagMap = flagMap
	mc.ConfigFileFlagMap = configFileFlagMap
}

func (mc *MountConfig) prepareConfigFile() error {
	if mc.ConfigFileFlagMap == nil {
		return errors.New("got empty config file flag map")
	}

	configMap := map[string]interface{}{}

	for f, v := range mc.ConfigFileFlagMap {
		curLevel := configMap
		tokens := strings.Split(f, ":")
		for i, t := range tokens {
			if i == len(tokens)-1 {
				if _, ok := curLevel[t].(map[string]interface{}); ok {
					return fmt.Errorf("invalid config file flag: %q", f)
				}

				if intVal, err := strconv.ParseInt(v, 10, 64); err == nil {
					curLevel[t] = intVal
				} else if boolVal, err := strconv.ParseBool(v); err == nil {
					curLevel[t] = boolVal
				} else {
					curLevel[t] = v
				}

				break
			}

			if _, ok := curLevel[t]; !ok {
				curLevel[t] = map[string]interface{}{}
			}

			if nextLevel, ok := curLevel[t].(map[string]interface{}); ok {
				curLevel = nextLevel
			} else {
				return fmt.Errorf("invalid config file flag: %q", f)
			}
		}
	}
	if mc.TokenServerIdentityProvider != "" && mc.HostNetworkKSAOptIn {
		configMap["gcs-auth"] = map[string]interface{}{
			"token-url": unixSocketBasePath + filepath.Join(mc.TempDir, TokenFileName),
		}
	}

	yamlData, err := yaml.Marshal(&configMap)
	if err != nil {
		return err
	}

	klog.Infof("gcsfuse config file content: %v", configMap)

	return os.WriteFile(mc.ConfigFile, yamlData, 0o400)
}

// StartCloudProfiler starts the Google Cloud Profiler.
// It uses sync.Once to ensure the profiler is started at most once per process.
func StartCloudProfiler(serviceName string, podName string, podUID string) {
	if podName == "" || podUID == "" {
		klog.Warningf("Cloud Profiler is disabled because PodName (%q) or PodUID (%q) is empty.", podName, podUID)
		return
	}
	serviceVersion := util.GetCloudProfilerServiceVersion(podName, podUID)
	startProfilerOnce.Do(func() {
		cfg := profiler.Config{
			Service:        serviceName,
			ServiceVersion: serviceVersion,
		}
		if err := profiler.Start(cfg); err != nil {
			klog.Errorf("Errored while starting cloud profiler, got %v", err)
		} else {
			klog.Infof("Running cloud profiler on %s with version %s", cfg.Service, cfg.ServiceVersion)
		}
	})
}
