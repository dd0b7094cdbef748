/*
Copyright 2018 The Kubernetes Authors.
Copyright 2024 Google LLC

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

package metrics

import (
	"context"
	"fmt"
	"io"
	"iter"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/googlecloudplatform/gcs-fuse-csi-driver/pkg/cloud_provider/clientset"
	"github.com/googlecloudplatform/gcs-fuse-csi-driver/pkg/util"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

const (
	SocketName = "metrics.sock"

	metricsPath = "/metrics"
	unixURL     = "http://unix/"
)

type Manager interface {
	InitializeHTTPHandler()
	RegisterMetricsCollector(mountPath, podNamespace, podName, bucketName, nodeName, emptyDirBasePath, podUID, volumeName string)
	UnregisterMetricsCollector(mountPath, nodeName, podUID, volumeName string)
}

type manager struct {
	registry        *prometheus.Registry
	metricsEndpoint string
	fuseSocketDir   string
	clientset       clientset.Interface
	streamMetrics   bool

	maximumNumberOfCollectors int
	volumeMountPathRegistered sets.Set[string]
	mutex                     sync.Mutex
}

func NewMetricsManager(metricsEndpoint, fuseSocketDir string, maximumNumberOfCollectors int, clientset clientset.Interface, streamMetrics bool) Manager {
	mm := &manager{
		registry:                  prometheus.NewRegistry(),
		metricsEndpoint:           metricsEndpoint,
		fuseSocketDir:             fuseSocketDir,
		clientset:                 clientset,
		streamMetrics:             streamMetrics,
		volumeMountPathRegistered: sets.Set[string]{},
		maximumNumberOfCollectors: maximumNumberOfCollectors,
		mutex:                     sync.Mutex{},
	}

	return mm
}

// InitializeHTTPHandler sets up a server and creates a handler for metrics.
func (mm *manager) InitializeHTTPHandler() {
	mux := http.NewServeMux()
	mux.HandleFunc(metricsPath, promhttp.HandlerFor(mm.registry, promhttp.HandlerOpts{}).ServeHTTP)

	// Configure the http server and start it.
	metricServer := &http.Server{
		Addr:           mm.metricsEndpoint,
		Handler:        mux,
		ReadTimeout:    10 * time.Second,
		WriteTimeout:   10 * time.Second,
		MaxHeaderBytes: 1 << 20,
	}

	go func() {
		klog.Infof("metric server listening at %q", mm.metricsEndpoint)
		if err := metricServer.ListenAndServe(); err != nil {
			klog.Errorf("failed to start metric server at specified endpoint %q and path %q: %v", mm.metricsEndpoint, metricsPath, err)
		}
	}()
}

// RegisterMetricsCollector registers the metrics collector. It is idempotent to register the same collector.
func (mm *manager) RegisterMetricsCollector(mountPath, podNamespace, podName, bucketName, nodeName, emptyDirBasePath, podUID, volumeName string) {
	socketBasePath := util.GetSocketBasePath(podUID, volumeName, mm.fuseSocketDir)
	if err := os.Symlink(emptyDirBasePath, socketBasePath); err != nil && !os.IsExist(err) {
		klog.Errorf("failed to create symbolic link to path %q: %v", socketBasePath, err)
		return
	}

	c := NewMetricsCollector(socketBasePath, emptyDirBasePath, podNamespace, podName, podUID, volumeName, map[string]string{
		"pod_name":       podName,
		"namespace_name": podNamespace,
		"volume_name":    volumeName,
		"bucket_name":    bucketName,
		"pod_uid":        "", // podUID is emptied to avoid infinite cardinality in the metric labels
	}, mm.clientset, mm.streamMetrics)

	// Lock the number of registered collectors while we attempt to register a new collector.
	mm.mutex.Lock()
	defer mm.mutex.Unlock()

	if mm.maximumNumberOfCollectors == 0 {
		klog.Infof("could not register metrics collector for mount path %q. The metrics collector limit for node %q is set to zero.", mountPath, nodeName)
		return
	}

	// Check if we need to register collector. We register a collector when the following are met:
	// 1. There is space on the metrics pipeline for the collector to be registered.
	// 2. The metrics collector has not previously been registered.
	if mm.maximumNumberOfCollectors > 0 {
		// If volume is already registered, do not register again. This flow can get triggered
		//  since CSI driver has republishVolume capability.
		if mm.volumeMountPathRegistered.Has(mountPath) {
			return
		}
		// If collector hasn't been registered and there's no space left, log a warning.
		if mm.volumeMountPathRegistered.Len() >= mm.maximumNumberOfCollectors {
			klog.V(4).Infof("could not register a metrics collector for mount path %q. There's already %d collectors registered on node %q.", mountPath, mm.volumeMountPathRegistered.Len(), nodeName)
			return
		}
	}

	// Attempt to register new metrics collector and record success.
	err := mm.registry.Register(c)
	if err != nil {
		if !strings.Contains(err.Error(), prometheus.AlreadyRegisteredError{}.Error()) {
			klog.Errorf("failed to register metrics collector for mount path %q, bucket %q: %v", mountPath, bucketName, err)
		}
	} else {
		mm.volumeMountPathRegistered.Insert(mountPath)
		klog.Infof("successfully registered a new metrics collector for mount path %q. There's %d collectors registered on node %q.", mountPath, mm.volumeMountPathRegistered.Len(), nodeName)
	}
}

// UnregisterMetricsCollector unregisters the metrics collector. It is idempotent to unregister the same collector.
func (mm *manager) UnregisterMetricsCollector(mountPath, nodeName, podUID, volumeName string) {
	// metricsCollector uses a hash of pod UID and volume name as an identifier.
	c := NewMetricsCollector("", "", "", "", podUID, volumeName, nil, nil, mm.streamMetrics)

	// Lock the number of registered collectors while we attempt to unregister a collector.
	mm.mutex.Lock()
	defer mm.mutex.Unlock()

	if ok := mm.registry.Unregister(c); !ok {
		klog.Infof("Unregister metrics collector for mount path %q is not needed since the collector is not registered.", mountPath)
	} else {
		mm.volumeMountPathRegistered.Delete(mountPath)
		klog.Infof("successfully unregistered a metrics collector for mount path %q. There's %d collectors registered on node %q.", mountPath, mm.volumeMountPathRegistered.Len(), nodeName)
	}
}

type metricsCollector struct {
	emptyDirBasePath string
	constLabels      map[string]string
	namespace        string
	podName          string
	podUID           string
	volumeName       string
	httpClient       *http.Client
	clientset        clientset.Interface
	streamMetrics    bool
}

// NewMetricsCollector returns a new Collector exposing metrics read from the give path.
func NewMetricsCollector(socketBasePath, emptyDirBasePath, namespace, podName, podUID, volumeName string, labels map[string]string, clientset clientset.Interface, streamMetrics bool) prometheus.Collector {
	c := &metricsCollector{
		emptyDirBasePath: emptyDirBasePath,
		constLabels:      labels,
		namespace:        namespace,
		podName:          podName,
		podUID:           podUID,
		volumeName:       volumeName,
		clientset:        clientset,
		streamMetrics:    streamMetrics,
	}

	// Creating a new HTTP client that is configured to make HTTP requests over a unix domain socket.
	c.httpClient = &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{
			DialContext: func(_ context.Context, _, _ string) (net.Conn, error) {
				return net.Dial("unix", filepath.Join(socketBasePath, SocketName))
			},
		},
	}

	return c
}

// Describe emits the description of metrics.
// Prometheus Registry relies on this func to identify collectors.
func (c *metricsCollector) Describe(ch chan<- *prometheus.Desc) {
	// Collector id is a hash of the values of the ConstLabels and fqName.
	ch <- prometheus.NewDesc("gke_gcsfuse_csi_metric", "GKE GCSFuse CSI metric.", nil, map[string]string{"pod_uid": c.podUID, "volume_name": c.volumeName})
}

// Collect scrapes metrics from the sidecar and emits metrics.
func (c *metricsCollector) Collect(ch chan<- prometheus.Metric) {
	pod, err := c.clientset.GetPod(c.namespace, c.podName)
	if err != nil || pod == nil || pod.Status.Phase != corev1.PodRunning || pod.DeletionTimestamp != nil {
		klog.V(6).Infof("pod %v/%v does not exist, skip metrics scraping", c.namespace, c.podName)

		return
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, unixURL, nil)
	if err != nil {
		klog.Errorf("failed to create scrape metrics request: %v", err)

		return
	}

	resp, err := c.httpClient.Do(req)
	if err != nil {
		klog.Errorf("failed to scrape metrics: %v", err)

		return
	}
	defer resp.Body.Close()

	if resp.StatusCode != http.StatusOK {
		klog.Errorf("unexpected HTTP status: %v", resp.Status)

		return
	}

	if c.streamMetrics {
		for mf, err := range ProcessMetricsDataAsStream(resp.Body) {
			if err != nil {
				klog.Errorf("failed to decode metrics data: %v", err)
				return
			}
			c.emitMetricFamily(mf, ch)
		}
	} else {
		families, err := ProcessMetricsData(resp.Body)
		if err != nil {
			klog.Errorf("failed to process metrics data: %v", err)

			return
		}

		for _, mf := range families {
			c.emitMetricFamily(mf, ch)
		}
	}
}

// ProcessMetricsDataAsStream processes metrics that follow Prometheus text format,
// returning an iterator of MetricFamily.
func ProcessMetricsDataAsStream(metricsReader io.Reader) iter.Seq2[*dto.MetricFamily, error] {
	return func(yield func(*dto.MetricFamily, error) bool) {
		decoder := expfmt.NewDecoder(metricsReader, expfmt.FmtText)
		for {
			var mf dto.MetricFamily
			err := decoder.Decode(&mf)
			if err == io.EOF {
				break
			}
			if err != nil {
				yield(nil, err)
				return
			}
			if !yield(&mf, nil) {
				return
			}
		}
	}
}

// ProcessMetricsData processes metrics that follow Prometheus text format: https://prometheus.io/docs/instrumenting/exposition_formats/,
// returning its MetricFamily.
func ProcessMetricsData(metricsReader io.Reader) (map[string]*dto.MetricFamily, error) {
	var parser expfmt.TextParser
	metricFamilies, err := parser.TextToMetricFamilies(metricsReader)
	if err != nil {
		return nil, fmt.Errorf("failed to parse metrics: %w", err)
	}

	return metricFamilies, nil
}

// emitMetricFamily iterates MetricFamily, converts metricFamily.Metric to prometheus.Metric, and emits the metric via the given chan.
func (c *metricsCollector) emitMetricFamily(metricFamily *dto.MetricFamily, ch chan<- prometheus.Metric) {
	name := metricFamily.GetName()
	help := metricFamily.GetHelp()
	metricType := metricFamily.GetType()

	var cachedDesc *prometheus.Desc

	var cachedLabelNames []string

	for _, metric := range metricFamily.GetMetric() {
		labels := metric.GetLabel()

		var desc *prometheus.Desc
		// Reuse cached prometheus.Desc assuming identical label ordering.
		if cachedDesc != nil && len(cachedLabelNames) == len(labels) {
			desc = cachedDesc
			for i, label := range labels {
				if cachedLabelNames[i] != label.GetName() {
					// Cache new prometheus.Desc to reduce garbage collection overhead and expensive string formatting.
					desc = nil
					break
				}
			}
		}

		if desc == nil {
			labelNames := make([]string, len(labels))
			for i, label := range labels {
				labelNames[i] = label.GetName()
			}
			desc = prometheus.NewDesc(name, help, labelNames, prometheus.Labels(c.constLabels))
			cachedDesc = desc
			cachedLabelNames = labelNames
		}

		labelValues := make([]string, len(labels))
		for i, label := range labels {
			labelValues[i] = label.GetValue()
		}

		switch metricType {
		case dto.MetricType_COUNTER:
			ch <- prometheus.MustNewConstMetric(
				desc,
				prometheus.CounterValue, metric.GetCounter().GetValue(), labelValues...,
			)

		case dto.MetricType_GAUGE:
			ch <- prometheus.MustNewConstMetric(
				desc,
				prometheus.GaugeValue, metric.GetGauge().GetValue(), labelValues...,
			)

		case dto.MetricType_UNTYPED:
			ch <- prometheus.MustNewConstMetric(
				desc,
				prometheus.UntypedValue, metric.GetUntyped().GetValue(), labelValues...,
			)

		case dto.MetricType_SUMMARY:
			quantiles := make(map[float64]float64, len(metric.GetSummary().GetQuantile()))
			for _, q := range metric.GetSummary().GetQuantile() {
				quantiles[q.GetQuantile()] = q.GetValue()
			}
			ch <- prometheus.MustNewConstSummary(
				desc,
				metric.GetSummary().GetSampleCount(),
				metric.GetSummary().GetSampleSum(),
				quantiles, labelValues...,
			)

		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			buckets := make(map[float64]uint64, len(metric.GetHistogram().GetBucket()))
			for _, b := range metric.GetHistogram().GetBucket() {
				buckets[b.GetUpperBound()] = b.GetCumulativeCount()
			}
			ch <- prometheus.MustNewConstHistogram(
				desc,
				metric.GetHistogram().GetSampleCount(),
				metric.GetHistogram().GetSampleSum(),
				buckets, labelValues...,
			)

		default:
			klog.Errorf("unknown metric type: %v", metricType)
		}
	}
}

type PrometheusMetricManager interface {
	InitializeHTTPHandler()
	RecordSyncPVMetric(err error)
	RecordSyncPodMetric(err error)
}

type prometheusMetricManager struct {
	mux             *http.ServeMux
	metricsEndpoint string
	syncPVCounter   *prometheus.CounterVec
	syncPodCounter  *prometheus.CounterVec
}

// NewPrometheusMetricManager initializes and returns a prometheusMetricManager.
// This manager is intended to encapsulate Prometheus metric definitions
// and registrations used by this application. New metrics can be added here.
// Note that this manager is orthogonal to the metrics collector above.
// Use the metrics collector instead if your component is running on user nodes.
func NewPrometheusMetricManager(metricsEndpoint string, mux *http.ServeMux) *prometheusMetricManager {
	pmm := prometheusMetricManager{
		metricsEndpoint: metricsEndpoint,
		mux:             mux,
	}

	pmm.syncPVCounter = prometheus.NewCounterVec(
		prometheus.CounterOpts{
			Name: "sync_pv_count",
			Help: "Number of syncPV operations",
		},
		[]string{"status_code"},
	)
	prometheus.MustRegister(pmm.syncPVCounter)

	pmm.syncPodCounter = prometheus.NewCounterVec(
		prometheus.CounterOpts{
			Name: "sync_pod_count",
			Help: "Number of syncPod operations",
		},
		[]string{"status_code"},
	)
	prometheus.MustRegister(pmm.syncPodCounter)

	return &pmm
}

// InitializeHTTPHandler sets up a server and creates a handler for metrics.
func (pmm *prometheusMetricManager) InitializeHTTPHandler() {
	if pmm == nil || pmm.mux == nil {
		return
	}
	pmm.mux.Handle(metricsPath, promhttp.Handler())
	go func() {
		klog.Infof("ServeMux listening on HTTP endpoint %v and metrics path: %v", pmm.metricsEndpoint, metricsPath)
		err := http.ListenAndServe(pmm.metricsEndpoint, pmm.mux)
		if err != nil {
			klog.Fatalf("Failed to start HTTP server at specified endpoint and metrics path, err %v", err)
		}
	}()
}

func (pmm *prometheusMetricManager) RecordSyncPVMetric(err error) {
	if pmm == nil {
		return
	}
	pmm.syncPVCounter.WithLabelValues(GetErrorCode(err)).Inc()
}

func (pmm *prometheusMetricManager) RecordSyncPodMetric(err error) {
	if pmm == nil {
		return
	}
	pmm.syncPodCounter.WithLabelValues(GetErrorCode(err)).Inc()
}

func GetErrorCode(err error) string {
	// A nil error means success.
	if err == nil {
		return codes.OK.String()
	}

	internalErr, _ := status.FromError(err)
	code := internalErr.Code().String()
	return code
}
